"""One GRPO group's update on SmolLM2 (DART, two routed rank-8 adapters, frozen base): the group's
common prompt run once for its rows (`train.share_prefix`, rl/batch.split_shared_prefix) vs one
forward / backward per full row — dart_jax's default and verl's way — and PyTorch's update of the
same full rows (the authors' concatenated-2r module, bench/train.py), sides interleaved.

The shape of an NL2SQL group (configs/quickstart_sql.py): a schema prompt of `prompt` tokens, G
continuations of `cont` tokens each (turns, observations, the solution), loss on the continuation.
Both dart_jax sides compute the same gradient (tests/rl/test_shared_prefix.py); the shared side does
1/G of the prompt's work. Model FLOPs (matmuls, frozen base: forward + activation backward):
    per row    2·2·P_mm·G·(prompt + cont)        shared    2·2·P_mm·(prompt + G·cont)
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np

from dart_jax.adapters.method import MethodSpec, init_adapters
from dart_jax.bench.timing import interleaved, matmul_probe, peak_per_round, ratio
from dart_jax.bench.train import _torch_update, matmul_params
from dart_jax.checkpoints.registry import load_model
from dart_jax.models.names import resolve
from dart_jax.rl.batch import PREFIX_KEYS, split_shared_prefix
from dart_jax.rl.optim import make_optimizer
from dart_jax.rl.step import BATCH_KEYS, init_state, make_train_step
from dart_jax.run.spec import LossConfig, OptimConfig


def group_batch(vocab: int, group: int, prompt: int, cont: int, seed: int = 0) -> dict[str, np.ndarray]:
    """G rows: one prompt (no loss), then each row's own continuation (loss, ~15% tool-routed)."""
    rng = np.random.default_rng(seed)
    length = prompt + cont
    tokens = rng.integers(0, vocab, (group, length)).astype(np.int32)
    tokens[:, :prompt] = tokens[0, :prompt]
    positions = np.tile(np.arange(length, dtype=np.int32), (group, 1))
    mask = np.zeros((group, length), np.float32)
    mask[:, prompt:] = 1.0
    routes = (rng.random((group, length)) < 0.15).astype(np.int32)
    routes[:, :prompt] = routes[0, :prompt]
    lroles = np.concatenate([np.full((group, 1), -1), routes[:, :-1]], 1).astype(np.int32)
    old = rng.normal(-3.0, 0.5, (group, length)).astype(np.float32)
    ref = old + rng.normal(0, 0.05, (group, length)).astype(np.float32)
    return {"tokens": tokens, "positions": positions, "route_ids": routes, "loss_roles": lroles,
            "loss_mask": mask, "old_logp": old, "ref_logp": ref,
            "advantages": rng.normal(size=group).astype(np.float32)}


def bench_group_update(model: str = "smollm2-135m-instruct", group: int = 8, prompt: int = 704, cont: int = 320,
                       repeats: int = 3, with_torch: bool = True, remat_policy: str = "dots_no_batch",
                       pad_multiple: int = 64) -> dict:
    path = resolve(model)
    cfg, base = load_model(path, remat_policy=remat_policy)
    method = MethodSpec("dart", rank=8, alpha=16.0)
    adapters = init_adapters(method, cfg, jax.random.PRNGKey(0))
    host_adapters = jax.device_get(adapters)
    lc, oc = LossConfig(), OptimConfig(lr=1e-5, warmup_steps=0)
    data = group_batch(cfg.vocab_size, group, prompt, cont)
    plain = {k: data[k][None] for k in BATCH_KEYS}               # one micro-batch: the group
    shared = split_shared_prefix(plain, pad_multiple)
    assert PREFIX_KEYS[0] in shared
    step = jax.jit(make_train_step(cfg, method, lc, oc), donate_argnums=(0,))
    sides, holders = {}, {}
    for name, mb in (("per_row", plain), ("shared", shared)):
        mb = {k: jnp.asarray(v) for k, v in mb.items()}
        holders[name] = {"state": init_state(jax.tree.map(jnp.asarray, host_adapters), make_optimizer(oc))}

        def run(mb=mb, h=holders[name]):
            h["state"], m = step(h["state"], base, mb, jax.random.PRNGKey(0), 0)
            jax.block_until_ready(m)
            h["loss"] = float(m["loss"])
        sides[name] = run
    mm, mm_flops = matmul_probe()
    sides["matmul"] = mm
    if with_torch:
        sides["torch_concat_2r"] = _torch_update("concat_2r", path, host_adapters, data, lc, oc)
    results = interleaved(sides, warmup=1, repeats=repeats)
    p_mm = matmul_params(cfg)
    flops = {"per_row": 4 * p_mm * group * (prompt + cont), "shared": 4 * p_mm * (prompt + group * cont)}
    peaks = peak_per_round(results, mm_flops)
    frac = {s: float(np.median([flops[s] / t / p for t, p in zip(results[s]["times_s"], peaks)])) for s in flops}
    out = {"bench": "group_update", "model": model, "group": group, "prompt": prompt, "cont": cont,
           "remat_policy": remat_policy, "device": jax.devices()[0].platform,
           "median_s": {s: r["median_s"] for s, r in results.items()}, "matmul_flops": float(np.median(peaks)),
           "matmul_model_flops": flops, "flops_frac_of_matmul": frac,
           "per_row_over_shared": ratio(results, "per_row", "shared"),
           # both sides made the same updates from the same state: their last losses agree if the gradients do
           "last_loss": {s: holders[s]["loss"] for s in holders}, "details": results}
    if with_torch:
        out["torch_over_shared"] = ratio(results, "torch_concat_2r", "shared")
    return out
