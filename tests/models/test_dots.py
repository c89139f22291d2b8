"""models.dots: a bf16 product accumulated in fp32 and rounded once, fp32 untouched.

The reference is numpy: the fp32 product of the bf16 operands' exact values, rounded to bf16 once.
Tolerance: one bf16 unit in the last place (a different summation order can round the other way)."""

import jax
import jax.numpy as jnp
import ml_dtypes
import numpy as np

from dart_jax.models import dots


def _operands(m=16, k=96, n=40, seed=0):
    rng = np.random.default_rng(seed)
    return rng.standard_normal((m, k)).astype(np.float32), rng.standard_normal((k, n)).astype(np.float32)


def test_fp32_is_the_plain_einsum_and_dot():
    x, w = _operands()
    assert str(jax.make_jaxpr(lambda a, b: dots.einsum("mk,kn->mn", a, b))(x, w)) == \
        str(jax.make_jaxpr(lambda a, b: jnp.einsum("mk,kn->mn", a, b))(x, w))
    assert str(jax.make_jaxpr(dots.dot)(x, w)) == str(jax.make_jaxpr(jnp.dot)(x, w))


def test_bf16_is_the_fp32_product_rounded_once():
    x, w = _operands()
    xb, wb = x.astype(ml_dtypes.bfloat16), w.astype(ml_dtypes.bfloat16)
    exact = xb.astype(np.float64) @ wb.astype(np.float64)
    want = exact.astype(np.float32).astype(ml_dtypes.bfloat16).astype(np.float64)
    ulp = np.abs(want) * 2.0 ** -7                       # bf16: 8 significant bits
    for got in (dots.einsum("mk,kn->mn", jnp.asarray(xb), jnp.asarray(wb)), dots.dot(jnp.asarray(xb), jnp.asarray(wb))):
        assert got.dtype == jnp.bfloat16
        err = np.abs(np.asarray(got).astype(np.float64) - want)
        assert (err <= ulp + 1e-30).all(), float((err / ulp).max())
        assert (err == 0).mean() > 0.95                  # almost every entry is the correctly rounded product
    text = jax.jit(lambda a, b: dots.einsum("mk,kn->mn", a, b)).lower(jnp.asarray(xb), jnp.asarray(wb)).as_text()
    assert "f32" in text and "bf16" in text              # an fp32 result, then one convert to bf16


def test_mixed_dtypes_promote_as_jnp_does():
    x, w = _operands()
    xb = jnp.asarray(x, jnp.bfloat16)
    assert dots.dot(xb, jnp.asarray(w)).dtype == jnp.dot(xb, jnp.asarray(w)).dtype == jnp.float32
    np.testing.assert_array_equal(np.asarray(dots.einsum("mk,kn->mn", xb, jnp.asarray(w))),
                                  np.asarray(jnp.einsum("mk,kn->mn", xb, jnp.asarray(w))))
