"""Matmuls in the operands' dtype, accumulated in fp32.

`einsum` / `dot` return what `jnp.einsum` / `jnp.dot` returns — fp32 in, fp32 out (the very same
program); bf16 in, bf16 out — but on XLA:CPU a low-precision product is asked for with an fp32 result
(`preferred_element_type`) and rounded once: the arithmetic of torch's bf16 matmuls. Against XLA's
own bf16-out dot a few entries in ten thousand differ, by one bf16 rounding (summation order).

Why: XLA:CPU (jaxlib 0.10.2) runs a bf16-out dot by converting both operands to fp32 — a full fp32
copy of the weight each call — and multiplying in fp32, while a bf16 × bf16 → fp32 dot runs on
YNNPACK's bf16 kernels (AVX512-BF16 on this host) with no copies (`python -m launch.bench matmul`,
docs/performance.md). The backward is written out the same way (a custom VJP: the two transposed
products, each bf16 × bf16 → fp32, rounded once), where autodiff would multiply an fp32 cotangent by
upcast bf16 operands. The rounded bf16 result carries the checkpoint name DOTS, which the models'
"dots" remat policies save, so a saved product stays bf16 (the fp32 one inside the custom VJP is
never a residual).

Only products without batch dimensions (projections, heads, LoRA factors) take this form: XLA:CPU's
fallback dot kernel has no bf16 × bf16 → fp32 case, and a batched product YNNPACK does not claim
(MixLoRA's per-expert "bter,erf->btef") fails to run. Whether the form runs at all is probed once per
process on a tiny product; where it does not, everything stays plain. On GPU and TPU the plain form is
kept: their bf16 dots accumulate in fp32 already (tensor cores, the MXU). The choice is the process's
default backend when the program is traced.
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
from jax.ad_checkpoint import checkpoint_name

DOTS = "dots_acc32"


@functools.cache
def _runs(dtype: str) -> bool:
    """Whether this process's CPU backend runs a `dtype` × `dtype` → fp32 dot (probed once, eagerly)."""
    try:
        with jax.ensure_compile_time_eval():
            a = jnp.ones((2, 3), dtype)
            jax.block_until_ready(jnp.dot(a, a.T, preferred_element_type=jnp.float32))
        return True
    except Exception:  # noqa: BLE001 (XLA's "unsupported element type" is a runtime error of its own kind)
        return False


def _low(dtype) -> bool:
    """A floating dtype narrower than fp32 (bf16, fp16) on XLA:CPU: the product is then asked for in fp32."""
    return (jnp.issubdtype(dtype, jnp.floating) and jnp.finfo(dtype).bits < 32 and jax.default_backend() == "cpu"
            and _runs(jnp.dtype(dtype).name))


def _terms(spec: str) -> tuple[str, str, str] | None:
    """'X,W->O' -> (X, W, O) when its transposes are einsums too (explicit, no repeated or lone indices)."""
    if "..." in spec or "->" not in spec:
        return None
    ins, out = spec.replace(" ", "").split("->")
    parts = ins.split(",")
    if len(parts) != 2:
        return None
    x, w = parts
    if any(len(set(t)) != len(t) for t in (x, w, out)) or set(x) - set(w + out) or set(w) - set(x + out) \
            or set(out) - set(x + w):
        return None
    return x, w, out


def _acc32(spec: str, a: jnp.ndarray, b: jnp.ndarray, dtype) -> jnp.ndarray:
    return jnp.einsum(spec, a, b, preferred_element_type=jnp.float32).astype(dtype)


@functools.partial(jax.custom_vjp, nondiff_argnums=(0,))
def _einsum(spec, x, w):
    return _acc32(spec, x, w, x.dtype)


def _einsum_fwd(spec, x, w):
    return _acc32(spec, x, w, x.dtype), (x, w)


def _einsum_bwd(spec, res, g):
    x, w = res
    tx, tw, to = _terms(spec)
    return _acc32(f"{to},{tw}->{tx}", g.astype(x.dtype), w, x.dtype), \
        _acc32(f"{tx},{to}->{tw}", x, g.astype(x.dtype), w.dtype)


_einsum.defvjp(_einsum_fwd, _einsum_bwd)


def einsum(spec: str, x: jnp.ndarray, w: jnp.ndarray) -> jnp.ndarray:
    """jnp.einsum(spec, x, w); on XLA:CPU a low-precision product of same-dtype operands without batch
    dimensions is accumulated in fp32 and rounded once (forward and backward), its result named DOTS."""
    terms = _terms(spec)
    if x.dtype != w.dtype or terms is None or set(terms[0]) & set(terms[1]) & set(terms[2]) or not _low(x.dtype):
        return jnp.einsum(spec, x, w)
    return checkpoint_name(_einsum(spec, x, w), DOTS)


def dot(x: jnp.ndarray, w: jnp.ndarray) -> jnp.ndarray:
    """jnp.dot(x, w) of two matrices, as `einsum`."""
    if x.ndim != 2 or w.ndim != 2:
        return jnp.dot(x, w)
    return einsum("ij,jk->ik", x, w)
