"""The model's matmul shapes in fp32 and bf16, XLA:CPU against torch, interleaved (timing.py).

What it separates: a bf16 product written as `jnp.einsum` of bf16 operands (a bf16 result: XLA:CPU
converts both operands to fp32 and multiplies in fp32), the same product asked for in fp32 and rounded
once (`models.dots`, what the models run: YNNPACK's bf16 kernels where the CPU has them), fp32, and
torch's fp32 / bf16 matmuls (oneDNN). Shapes from the model's config: a projection and the output head at M rows — 32
(a decode step of 32 rows) and 512 (a 4 × 128 log-prob chunk of the update).

    python -m launch.bench matmul                      # SmolLM2-135M's shapes, M = 32 and 512
"""

from __future__ import annotations

import numpy as np

from dart_jax.bench.timing import interleaved, matmul_probe, peak_per_round, ratio
from dart_jax.checkpoints.registry import load_model
from dart_jax.models.config import ModelConfig
from dart_jax.models.names import resolve

SIDES = ("jax_fp32", "jax_bf16_out", "jax_bf16_acc32", "torch_fp32", "torch_bf16")


def shapes(cfg: ModelConfig, rows=(32, 512)) -> list[tuple[str, int, int, int]]:
    """(name, M, K, N) for the FFN up / down projections and the output head at each row count."""
    d, f, v = cfg.hidden_size, cfg.intermediate_size, cfg.vocab_size
    return [(name, m, k, n) for m in rows for name, k, n in (("up", d, f), ("down", f, d), ("head", d, v))]


def _sides(m: int, k: int, n: int, with_torch: bool, seed: int = 0) -> dict:
    import jax
    import jax.numpy as jnp

    from dart_jax.models import dots
    rng = np.random.default_rng(seed)
    x, w = rng.standard_normal((m, k), np.float32), (rng.standard_normal((k, n)) / np.sqrt(k)).astype(np.float32)
    plain = jax.jit(lambda a, b: jnp.einsum("mk,kn->mn", a, b))   # fp32 in: fp32 out; bf16 in: bf16 out
    acc32 = jax.jit(lambda a, b: dots.einsum("mk,kn->mn", a, b))
    xf, wf = jnp.asarray(x), jnp.asarray(w)
    xb, wb = xf.astype(jnp.bfloat16), wf.astype(jnp.bfloat16)
    sides = {"jax_fp32": lambda: plain(xf, wf).block_until_ready(),
             "jax_bf16_out": lambda: plain(xb, wb).block_until_ready(),
             "jax_bf16_acc32": lambda: acc32(xb, wb).block_until_ready()}
    same = np.asarray(plain(xb, wb).astype(jnp.float32)), np.asarray(acc32(xb, wb).astype(jnp.float32))
    agree = {"differing": int((same[0] != same[1]).sum()), "of": m * n,
             # summation order: relative to the product's largest entry (near-zero sums differ more, relatively)
             "max_diff_of_scale": float(np.abs(same[0] - same[1]).max() / np.abs(same[0]).max())}
    if with_torch:
        import torch
        tf, tw = torch.tensor(x), torch.tensor(w)
        tb, twb = tf.bfloat16(), tw.bfloat16()

        def run(a, b):
            with torch.no_grad():
                return a @ b
        sides["torch_fp32"] = lambda: run(tf, tw)
        sides["torch_bf16"] = lambda: run(tb, twb)
    return sides, agree


def bench_matmul(model: str = "smollm2-135m-instruct", rows=(32, 512), repeats: int = 5,
                 with_torch: bool = True) -> dict:
    cfg, _ = load_model(resolve(model))
    mm, mm_flops = matmul_probe()
    out, peaks = [], []
    for name, m, k, n in shapes(cfg, rows):
        sides, agree = _sides(m, k, n, with_torch)
        sides["matmul"] = mm
        # a small product is microseconds: each timed call runs it `inner` times (~1 GFLOP, at most 1,000 calls)
        inner = min(1000, max(1, int(1e9 // (2 * m * k * n))))
        timed = {s: (lambda f=f: [f() for _ in range(inner)]) for s, f in sides.items() if s != "matmul"}
        timed["matmul"] = mm
        res = interleaved(timed, repeats=repeats)
        peaks += peak_per_round(res, mm_flops)
        flops = 2.0 * m * k * n * inner
        row = {"name": name, "m": m, "k": k, "n": n, "agree": agree,
               "gflops": {s: flops / res[s]["median_s"] / 1e9 for s in timed if s != "matmul"},
               "bf16_out_over_acc32": ratio(res, "jax_bf16_out", "jax_bf16_acc32"),
               "fp32_over_bf16_acc32": ratio(res, "jax_fp32", "jax_bf16_acc32")}
        if with_torch:
            row["torch_bf16_over_jax_bf16_acc32"] = ratio(res, "torch_bf16", "jax_bf16_acc32")
            row["torch_fp32_over_jax_fp32"] = ratio(res, "torch_fp32", "jax_fp32")
        out.append(row)
    return {"bench": "matmul", "model": model, "repeats": repeats, "matmul_flops": float(np.median(peaks)),
            "rows": out}
