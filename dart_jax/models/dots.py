"""Matmuls in the operands' dtype, accumulated in fp32.

`einsum` / `dot` return what `jnp.einsum` / `jnp.dot` of two same-dtype operands returns — fp32 in,
fp32 out (the very same program); bf16 in, bf16 out — but a low-precision product is requested with
an fp32 result (`preferred_element_type`) and rounded once. That is the arithmetic of torch's bf16
matmuls and of XLA's own bf16 dot, so the values do not change; the kernel does. On XLA:CPU (jaxlib
0.10.2, a CPU with AVX512-BF16) a bf16 × bf16 → fp32 dot runs on YNNPACK's bf16 kernels, while a
bf16-out dot falls back to a generic loop: [32, 576] × [576, 49152] took 16 ms against 93 ms (fp32:
28 ms), [32, 576] × [576, 1536] 0.45 against 0.84 ms (`python -m launch.bench matmul`).
"""

from __future__ import annotations

import jax.numpy as jnp


def _low(dtype) -> bool:
    """A floating dtype narrower than fp32 (bf16, fp16): the product is then accumulated in fp32."""
    return jnp.issubdtype(dtype, jnp.floating) and jnp.finfo(dtype).bits < 32


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
