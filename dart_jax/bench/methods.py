"""The paper's methods side by side on one backbone (the paper's efficiency claims): the training state each
holds and the time of one GRPO update, DART vs LoRA-16 vs full fine-tuning vs MixLoRA vs 2-Agent.

Memory is read from the live device arrays after `place_state` (what a run holds before its first
update): the frozen base in its dtype, and the train state — fp32 masters of every trainable
parameter plus AdamW's two fp32 moments, 12 bytes per trainable parameter — as `state_bytes`
(the largest shard of each leaf, summed: one device's share). It is quoted in units of P, the base's
parameter count × its bytes per parameter, the paper's accounting ("2-Agent ≈ 8P vs DART ≈ P +
O(p)"): in bf16 a full-parameter state is 6P (12 bytes / 2) on top of the base; two of them 12P. Not
counted: activations (they depend on batch, length and remat, not on the method) and the sampler's
decode copy of the weights.

Time: the jitted train step of each method on the same synthetic batch (~15% tool positions; each
method's route ids from the roles as its trainer sets them),
sides interleaved (timing.py) with a 2048² matmul probe in the same rounds.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np

from dart_jax.adapters.method import MethodSpec, init_adapters, routes_for
from dart_jax.bench.timing import interleaved, matmul_probe, ratio
from dart_jax.bench.train import synthetic_batch
from dart_jax.checkpoints.registry import load_model
from dart_jax.models.names import resolve
from dart_jax.parallel.mesh import make_mesh
from dart_jax.rl.optim import make_optimizer
from dart_jax.rl.placement import place_state, state_bytes_per_device
from dart_jax.rl.step import make_train_step
from dart_jax.run.spec import LossConfig, OptimConfig

METHODS = {
    "dart": dict(variant="dart", rank=8, alpha=16.0),
    "lora16": dict(variant="lora", rank=16, alpha=32.0),
    "full": dict(variant="full"),
    "mixlora": dict(variant="mixlora", rank=8, alpha=16.0, experts=2, top_k=2),
    "2agent": dict(variant="2agent"),
    "2agent_lora": dict(variant="2agent", agent_params="lora", rank=8, alpha=16.0),
}


def tree_bytes(tree) -> int:
    """Bytes one device holds of a tree of placed arrays (largest shard of each leaf)."""
    return sum(max(s.data.nbytes for s in x.addressable_shards) for x in jax.tree.leaves(tree)
               if hasattr(x, "addressable_shards"))


def bench_methods(model: str = "smollm2-135m-instruct", batch: int = 4, length: int = 256, repeats: int = 3,
                  methods: tuple[str, ...] = tuple(METHODS), dtype: str = "bfloat16", time_steps: bool = True) -> dict:
    path = resolve(model)
    cfg, base = load_model(path)
    cfg = cfg.replace(param_dtype=dtype, compute_dtype=dtype)
    base = jax.tree.map(lambda x: x.astype(cfg.weight_dtype), base)
    mesh = make_mesh((1, 1, 1), jax.devices()[:1])
    n_params = sum(int(np.prod(x.shape)) for x in jax.tree.leaves(base))
    p_bytes = n_params * jnp.dtype(dtype).itemsize
    oc = OptimConfig(lr=1e-6, warmup_steps=0, total_steps=10)
    lc = LossConfig(kl_coef=0.001)
    data = {k: jnp.asarray(v) for k, v in synthetic_batch(cfg, batch, length).items()}
    data = {k: v[None] for k, v in data.items()}  # one micro-batch
    rows, sides = {}, {}
    for name in methods:
        spec = MethodSpec(**METHODS[name])
        ads = init_adapters(spec, cfg, jax.random.PRNGKey(0))
        state, placed = place_state(spec, cfg, base, ads, make_optimizer(oc), mesh)
        trainable_n = sum(int(np.prod(x.shape)) for x in jax.tree.leaves(state.params))
        st, bb = state_bytes_per_device(state), tree_bytes(placed)
        rows[name] = {"trainable_params": trainable_n, "trainable_share": trainable_n / n_params,
                      "base_bytes": bb, "state_bytes": st, "total_bytes": bb + st,
                      "total_in_P": (bb + st) / p_bytes, "state_in_P": st / p_bytes}
        if time_steps:
            step = jax.jit(make_train_step(cfg, spec, lc, oc), donate_argnums=(0,))
            holder = {"state": state}
            mb = dict(data, route_ids=routes_for(spec, data["route_ids"]))  # roles -> this method's route ids

            def run(step=step, holder=holder, placed=placed, mb=mb):
                holder["state"], m = step(holder["state"], placed, mb, jax.random.PRNGKey(1), np.int32(0))
                jax.block_until_ready(m["loss"])
            sides[name] = run
    out = {"bench": "methods", "model": model, "dtype": dtype, "batch": batch, "length": length,
           "params": n_params, "P_bytes": p_bytes, "device": jax.devices()[0].platform, "rows": rows}
    if time_steps:
        probe, flops = matmul_probe()
        sides["matmul"] = probe
        res = interleaved(sides, repeats=repeats)
        for name in methods:
            rows[name]["step_s"] = res[name]["median_s"]
            rows[name]["step_over_dart"] = ratio(res, name, "dart") if "dart" in methods else None
        out["matmul_gflops"] = flops / res["matmul"]["median_s"] / 1e9
    return out
