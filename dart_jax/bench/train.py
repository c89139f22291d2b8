"""One GRPO update of DART (two routed rank-8 adapters, frozen base) on SmolLM2: dart_jax's jitted
step vs the same update in PyTorch, same tokens, same process, sides interleaved (timing.py).

PyTorch sides (transformers model, torch autograd, clip_grad_norm_, torch.optim.AdamW):
    concat_2r   the DART authors' module: one rank-2r LoRA per linear with a per-token channel mask
                (`parity/torch_lora.install_concatenated`) — the fastest honest PyTorch implementation
                of the same update, and the one the ratio is quoted against;
    peft_r16    PEFT with one rank-16 adapter, no routing — the floor (same LoRA FLOPs, less work);
    hooks       the cross-check reference (`install`): both rank-8 adapters on every token then
                masked, ≈ 2× the LoRA work — reported, not a fair opponent.
All compute: teacher-forced log-probs at T = 1 in fp32, the clipped GRPO loss with dual clip, k3 KL
against given reference log-probs, token-mean over the loss mask, backward, global-norm clip 1.0,
AdamW. Timed: the update only (old/ref log-probs are inputs). A 2048² fp32 matmul is timed in the
same rounds (`timing.matmul_probe`): the peak the update's FLOP rate is quoted against.

Model FLOPs per update (frozen base: the backward computes activation gradients only, ≈ the
forward's matmuls again; attention backward ≈ 2× its forward):
    2·(2·P_mm·tokens) + 3·(4·L·T²·N·H·B/2)        P_mm = matmul parameters incl. the head
"""

from __future__ import annotations

import statistics
import types

import jax
import jax.numpy as jnp
import numpy as np

from dart_jax.adapters.method import MethodSpec, init_adapters
from dart_jax.bench.timing import interleaved, matmul_probe, peak_per_round, ratio
from dart_jax.checkpoints.registry import load_model
from dart_jax.models.names import resolve
from dart_jax.models.transformer import unstack_layers
from dart_jax.rl.optim import make_optimizer
from dart_jax.rl.step import BATCH_KEYS, init_state, make_train_step
from dart_jax.run.spec import LossConfig, OptimConfig

TORCH_SIDES = ("concat_2r", "peft_r16", "hooks")


def matmul_params(cfg) -> int:
    """P_mm: the parameters a token's forward multiplies by (every layer's projections + the head)."""
    D, F, L, V = cfg.hidden_size, cfg.intermediate_size, cfg.num_layers, cfg.vocab_size
    N, K, H = cfg.num_heads, cfg.num_kv_heads, cfg.head_dim
    return L * (D * (N + 2 * K) * H + N * H * D + 3 * D * F) + D * V


def update_flops(cfg, batch: int, length: int) -> float:
    L, N, H = cfg.num_layers, cfg.num_heads, cfg.head_dim
    tokens = batch * length
    attn_fwd = 4 * L * length * length * N * H * batch / 2
    return 2 * (2 * matmul_params(cfg) * tokens) + 3 * attn_fwd


def synthetic_batch(cfg, batch: int, length: int, seed: int = 0) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(seed)
    tokens = rng.integers(0, cfg.vocab_size, (batch, length)).astype(np.int32)
    positions = np.tile(np.arange(length, dtype=np.int32), (batch, 1))
    mask = np.zeros((batch, length), np.float32)
    mask[:, length // 4:] = 1.0                       # a prompt, then the response
    routes = (rng.random((batch, length)) < 0.15).astype(np.int32)
    lroles = np.concatenate([np.full((batch, 1), -1), routes[:, :-1]], 1).astype(np.int32)
    old = rng.normal(-3.0, 0.5, (batch, length)).astype(np.float32)
    ref = old + rng.normal(0, 0.05, (batch, length)).astype(np.float32)
    adv = rng.normal(size=batch).astype(np.float32)
    return {"tokens": tokens, "positions": positions, "route_ids": routes, "loss_roles": lroles,
            "loss_mask": mask, "old_logp": old, "ref_logp": ref, "advantages": adv}


def _torch_update(side: str, path, adapters, batch, lc: LossConfig, oc: OptimConfig):
    """-> a closure running one PyTorch update of `side` (see the module docstring)."""
    import torch

    from dart_jax.parity.model_check import load_torch_model
    from dart_jax.parity.torch_lora import install, install_concatenated, torch_factors

    model = load_torch_model(path)
    for p in model.parameters():
        p.requires_grad_(False)
    names = sorted(adapters)  # reasoning = 0, tool = 1
    factors = [torch_factors(adapters[n]) for n in names]
    if side == "hooks":
        install(model, factors, [adapters[n].scale for n in names], batch["route_ids"])
        params = [t for f in factors for pair in f.values() for t in pair]
    elif side == "concat_2r":
        _, params = install_concatenated(model, factors[1], factors[0], adapters["tool"].scale, batch["route_ids"])
    elif side == "peft_r16":
        import peft
        model = peft.get_peft_model(model, peft.LoraConfig(r=16, lora_alpha=32, lora_dropout=0.0, target_modules=[
            "q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"]))
        params = [p for p in model.parameters() if p.requires_grad]
    else:
        raise ValueError(f"torch side {side!r}; expected one of {TORCH_SIDES}")
    opt = torch.optim.AdamW(params, lr=oc.lr, betas=(oc.b1, oc.b2), eps=oc.eps, weight_decay=oc.weight_decay)
    t = {k: torch.tensor(v) for k, v in batch.items()}
    ids = t["tokens"].long()

    from torch.profiler import record_function  # labels for bench/profile.py; no cost when not profiling

    def step():
        opt.zero_grad()
        out = model(input_ids=ids).logits
        with record_function("dart::logprobs"):
            logits = out.float() / lc.temperature
            lp = torch.log_softmax(logits[:, :-1], -1).gather(-1, ids[:, 1:, None])[..., 0]
            lp = torch.cat([torch.zeros_like(lp[:, :1]), lp], 1)
        with record_function("dart::loss"):
            a = t["advantages"][:, None]
            ratio_ = torch.exp(torch.clamp(lp - t["old_logp"], -20, 20))
            lclip = torch.maximum(-a * ratio_, -a * torch.clamp(ratio_, 1 - lc.clip_low, 1 + lc.clip_high))
            pg = torch.where(a < 0, torch.minimum(-a * lc.dual_clip, lclip), lclip)
            u = torch.clamp(t["ref_logp"] - lp, -20, 20)
            kl = torch.clamp(torch.exp(u) - u - 1, -10, 10)
            m = t["loss_mask"]
            loss = ((pg + lc.kl_coef * kl) * m).sum() / m.sum()
        loss.backward()
        with record_function("dart::optimizer"):
            torch.nn.utils.clip_grad_norm_(params, oc.clip_norm)
            opt.step()
        return loss

    return step


def setup_update(model: str, batch: int, length: int, remat_policy: str = "none", logprob_chunk: int | None = None,
                 loss: dict | None = None, unstack: bool = False, **overrides) -> types.SimpleNamespace:
    """The benchmarked update, ready to run: `ours()` runs one (donating and replacing the state) and
    returns its metrics; `step`, `holder["state"]`, `base`, `mb`, `key` are its jitted function and
    arguments; `data`, `host_adapters`, `lc`, `oc`, `path` build the PyTorch sides from the same inputs.
    `overrides` set ModelConfig fields (attention_impl, compute_dtype, ...); `logprob_chunk` and `loss`
    (LossConfig fields) the loss's; `unstack`: the base's layers as per-layer arrays, so they run as a
    Python loop instead of a scan (models.transformer.unstack_layers)."""
    path = resolve(model)
    cfg, base = load_model(path, remat_policy=remat_policy, **overrides)
    if unstack:
        base = unstack_layers(base)
    method = MethodSpec("dart", rank=8, alpha=16.0)
    adapters = init_adapters(method, cfg, jax.random.PRNGKey(0))
    host_adapters = jax.device_get(adapters)  # the jitted step donates (deletes) its input state
    lc = LossConfig(**(loss or {}), **({} if logprob_chunk is None else {"logprob_chunk": logprob_chunk}))
    oc = OptimConfig(lr=1e-5, warmup_steps=0)
    data = synthetic_batch(cfg, batch, length)
    mb = {k: jnp.asarray(data[k])[None] for k in BATCH_KEYS}
    step = jax.jit(make_train_step(cfg, method, lc, oc), donate_argnums=(0,))
    holder = {"state": init_state(adapters, make_optimizer(oc))}
    key = jax.random.PRNGKey(0)

    def ours():
        holder["state"], m = step(holder["state"], base, mb, key, 0)
        return jax.block_until_ready(m)

    return types.SimpleNamespace(path=path, cfg=cfg, base=base, host_adapters=host_adapters, lc=lc, oc=oc,
                                 data=data, mb=mb, step=step, holder=holder, key=key, ours=ours)


def bench_train(model: str = "smollm2-135m-instruct", batch: int = 4, length: int = 512, repeats: int = 5,
                with_torch: bool = True, remat_policy: str = "none", torch_sides=TORCH_SIDES) -> dict:
    u = setup_update(model, batch, length, remat_policy)
    cfg, path, ours, host_adapters, data, lc, oc = u.cfg, u.path, u.ours, u.host_adapters, u.data, u.lc, u.oc

    mm, mm_flops = matmul_probe()
    sides = {"dart_jax": ours, "matmul": mm}
    if with_torch:
        for side in torch_sides:
            sides[f"torch_{side}"] = _torch_update(side, path, host_adapters, data, lc, oc)
    results = interleaved(sides, warmup=1, repeats=repeats)
    flops = update_flops(cfg, batch, length)
    peaks = peak_per_round(results, mm_flops)
    ours_frac = [flops / t / p for t, p in zip(results["dart_jax"]["times_s"], peaks)]
    out = {"bench": "train", "model": model, "batch": batch, "length": length, "remat_policy": remat_policy,
           "device": jax.devices()[0].platform, "median_s": {k: v["median_s"] for k, v in results.items()},
           "update_flops": flops, "matmul_flops": statistics.median(peaks),
           "ours_flops_frac_of_matmul": statistics.median(ours_frac), "details": results,
           "ratios": {s: ratio(results, f"torch_{s}", "dart_jax") for s in torch_sides if with_torch}}
    return out
