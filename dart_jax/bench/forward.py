"""Forward throughput: dart_jax vs transformers on the same model and tokens, same process, sides
interleaved with a matmul probe (timing.py)."""

from __future__ import annotations

import statistics

import jax
import jax.numpy as jnp
import numpy as np

from dart_jax.bench.timing import interleaved, matmul_probe, peak_per_round, ratio
from dart_jax.checkpoints.registry import load_model
from dart_jax.models.names import resolve
from dart_jax.models.transformer import forward


def forward_flops(cfg, batch: int, length: int) -> float:
    """2·P_mm·tokens + causal attention (QKᵀ and PV over half the keys on average)."""
    D, F, L, V = cfg.hidden_size, cfg.intermediate_size, cfg.num_layers, cfg.vocab_size
    N, K, H = cfg.num_heads, cfg.num_kv_heads, cfg.head_dim
    p_mm = L * (D * (N + 2 * K) * H + N * H * D + 3 * D * F) + D * V
    return 2 * p_mm * batch * length + 4 * L * length * length * N * H * batch / 2


def bench_forward(model: str = "smollm2-135m-instruct", batch: int = 8, length: int = 512,
                  repeats: int = 5, compute_dtype: str = "float32", torch_threads: int | None = None) -> dict:
    import torch

    from dart_jax.parity.model_check import load_torch_model

    path = resolve(model)
    cfg, base = load_model(path, compute_dtype=compute_dtype, param_dtype=compute_dtype)
    rng = np.random.default_rng(0)
    tokens = rng.integers(0, cfg.vocab_size, (batch, length)).astype(np.int32)
    positions = np.broadcast_to(np.arange(length, dtype=np.int32), (batch, length))
    fwd = jax.jit(lambda b, t, p: forward(b, None, t, p, None, None, cfg=cfg)[0])
    jt, jp = jnp.asarray(tokens), jnp.asarray(positions)

    if torch_threads:
        torch.set_num_threads(torch_threads)
    ref = load_torch_model(path)
    tdtype = {"float32": torch.float32, "bfloat16": torch.bfloat16}[compute_dtype]
    ref = ref.to(tdtype)
    tt = torch.tensor(tokens, dtype=torch.long)

    def run_torch():
        with torch.no_grad():
            ref(input_ids=tt).logits

    mm, mm_flops = matmul_probe()
    res = interleaved({"dart_jax": lambda: fwd(base, jt, jp).block_until_ready(), "transformers": run_torch,
                       "matmul": mm}, repeats=repeats)
    n = batch * length
    flops = forward_flops(cfg, batch, length)
    peaks = peak_per_round(res, mm_flops)
    return {
        "bench": "forward", "model": model, "batch": batch, "length": length, "dtype": compute_dtype,
        "device": str(jax.devices()[0].platform), "torch_threads": torch.get_num_threads(),
        "ours_tokens_per_s": n / res["dart_jax"]["median_s"],
        "transformers_tokens_per_s": n / res["transformers"]["median_s"],
        "ratio": ratio(res, "transformers", "dart_jax"), "matmul_flops": statistics.median(peaks),
        "ours_flops_frac_of_matmul": statistics.median(
            flops / t / p for t, p in zip(res["dart_jax"]["times_s"], peaks)),
        "details": res,
    }
