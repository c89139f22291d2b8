"""Matmuls in the operands' dtype, accumulated in fp32.

`einsum` / `dot` return what `jnp.einsum` / `jnp.dot` of two same-dtype operands returns — fp32 in,
fp32 out (the very same program); bf16 in, bf16 out — but a low-precision product is requested with
an fp32 result (`preferred_element_type`) and rounded once: the arithmetic of torch's bf16 matmuls.
Against XLA's own bf16-out dot a few entries in ten thousand differ, by one bf16 rounding (summation
order); the kernel is what changes. On XLA:CPU (jaxlib
0.10.2, a CPU with AVX512-BF16) a bf16 × bf16 → fp32 dot runs on YNNPACK's bf16 kernels, while a
bf16-out dot falls back to a generic loop (`python -m launch.bench matmul`: docs/performance.md).
On GPU and TPU the plain form is kept: their bf16 dots accumulate in fp32 already (tensor cores, the
MXU), and an fp32 result there would only add memory traffic.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp


def _low(dtype) -> bool:
    """A floating dtype narrower than fp32 (bf16, fp16) on XLA:CPU: the product is then asked for in fp32."""
    return jnp.issubdtype(dtype, jnp.floating) and jnp.finfo(dtype).bits < 32 and jax.default_backend() == "cpu"


def einsum(spec: str, x: jnp.ndarray, w: jnp.ndarray) -> jnp.ndarray:
    """jnp.einsum(spec, x, w), a low-precision product accumulated in fp32 and rounded once to its dtype."""
    out = jnp.result_type(x, w)
    if not _low(out):
        return jnp.einsum(spec, x, w)
    return jnp.einsum(spec, x, w, preferred_element_type=jnp.float32).astype(out)


def dot(x: jnp.ndarray, w: jnp.ndarray) -> jnp.ndarray:
    """jnp.dot(x, w), a low-precision product accumulated in fp32 and rounded once to its dtype."""
    out = jnp.result_type(x, w)
    if not _low(out):
        return jnp.dot(x, w)
    return jnp.dot(x, w, preferred_element_type=jnp.float32).astype(out)
