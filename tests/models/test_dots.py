"""models.dots: on XLA:CPU a bf16 product accumulated in fp32 and rounded once, forward and backward;
fp32 untouched; saved bf16 under the "dots" remat policies.

References: numpy in float64 (the product of the bf16 operands' exact values, rounded to bf16 once)
and jnp.einsum's own autodiff. Tolerance: one bf16 unit in the last place of the reference value (a
different summation order can round the other way), and at least 95% of entries exact."""

import contextlib
import io
import re

import jax
import jax.numpy as jnp
import ml_dtypes
import numpy as np
import pytest
from jax.ad_checkpoint import print_saved_residuals

from dart_jax.models import dots
from dart_jax.models.transformer import _REMAT

SPECS = [("mk,kn->mn", (16, 96), (96, 40)), ("btd,dnh->btnh", (2, 8, 48), (48, 3, 16)),
         ("btnh,nhd->btd", (2, 8, 3, 16), (3, 16, 48))]


def _operands(xs, ws, seed=0):
    rng = np.random.default_rng(seed)
    return rng.standard_normal(xs).astype(np.float32), rng.standard_normal(ws).astype(np.float32)


def _ulp(v):
    return 2.0 ** (np.floor(np.log2(np.maximum(np.abs(v), 1e-30))) - 7)   # bf16: 8 significant bits


def _check_rounded_once(got, exact):
    want = exact.astype(np.float32).astype(ml_dtypes.bfloat16).astype(np.float64)
    err = np.abs(np.asarray(got).astype(np.float64) - want)
    assert (err <= _ulp(want)).all(), float((err / _ulp(want)).max())
    assert (err == 0).mean() > 0.95


def test_fp32_is_the_plain_einsum_and_dot():
    for spec, xs, ws in SPECS:
        x, w = _operands(xs, ws)
        assert str(jax.make_jaxpr(lambda a, b: dots.einsum(spec, a, b))(x, w)) == \
            str(jax.make_jaxpr(lambda a, b: jnp.einsum(spec, a, b))(x, w))
    x, w = _operands((4, 6), (6, 5))
    assert str(jax.make_jaxpr(dots.dot)(x, w)) == str(jax.make_jaxpr(jnp.dot)(x, w))


@pytest.mark.parametrize("spec,xs,ws", SPECS)
def test_bf16_forward_is_the_fp32_product_rounded_once(spec, xs, ws):
    x, w = _operands(xs, ws)
    xb, wb = x.astype(ml_dtypes.bfloat16), w.astype(ml_dtypes.bfloat16)
    got = dots.einsum(spec, jnp.asarray(xb), jnp.asarray(wb))
    assert got.dtype == jnp.bfloat16 and got.shape == jnp.einsum(spec, x, w).shape
    _check_rounded_once(got, np.einsum(spec, xb.astype(np.float64), wb.astype(np.float64)))
    # the product is an fp32 result, converted once to bf16
    text = jax.jit(lambda a, b: dots.einsum(spec, a, b)).lower(jnp.asarray(xb), jnp.asarray(wb)).as_text()
    assert re.search(r"dot_general.*-> tensor<[0-9x]+xf32>", text) and "stablehlo.convert" in text


@pytest.mark.parametrize("spec,xs,ws", SPECS)
def test_bf16_backward_is_each_transposed_product_rounded_once(spec, xs, ws):
    x, w = _operands(xs, ws)
    g = _operands(jnp.einsum(spec, x, w).shape, (1,), seed=1)[0]
    xb, wb, gb = (a.astype(ml_dtypes.bfloat16) for a in (x, w, g))
    _, vjp = jax.vjp(lambda a, b: dots.einsum(spec, a, b), jnp.asarray(xb), jnp.asarray(wb))
    gx, gw = vjp(jnp.asarray(gb))
    assert gx.dtype == gw.dtype == jnp.bfloat16
    tx, tw, to = spec.replace("->", ",").split(",")
    f64 = [a.astype(np.float64) for a in (xb, wb, gb)]
    _check_rounded_once(gx, np.einsum(f"{to},{tw}->{tx}", f64[2], f64[1]))
    _check_rounded_once(gw, np.einsum(f"{tx},{to}->{tw}", f64[0], f64[2]))
    # and what autodiff of the plain bf16 einsum gives, to within a rounding
    _, vjp_plain = jax.vjp(lambda a, b: jnp.einsum(spec, a, b), jnp.asarray(xb), jnp.asarray(wb))
    for a, b in zip((gx, gw), vjp_plain(jnp.asarray(gb))):
        d = np.abs(np.asarray(a, np.float64) - np.asarray(b, np.float64))
        assert (d <= 2 * _ulp(np.asarray(b, np.float64))).all()


def test_batched_products_mixed_dtypes_and_other_backends_take_the_plain_form(monkeypatch):
    # XLA:CPU's fallback dot cannot run a bf16 × bf16 → fp32 product YNNPACK does not claim (this one)
    x, w = (jnp.asarray(a, jnp.bfloat16) for a in _operands((2, 4, 3, 8), (3, 8, 24)))
    spec = "bter,erf->btef"
    assert str(jax.make_jaxpr(lambda a, b: dots.einsum(spec, a, b))(x, w)) == \
        str(jax.make_jaxpr(lambda a, b: jnp.einsum(spec, a, b))(x, w))
    assert dots.einsum(spec, x, w).dtype == jnp.bfloat16
    x, w = _operands((4, 6), (6, 5))
    xb = jnp.asarray(x, jnp.bfloat16)
    assert dots.dot(xb, jnp.asarray(w)).dtype == jnp.dot(xb, jnp.asarray(w)).dtype == jnp.float32
    np.testing.assert_array_equal(np.asarray(dots.einsum("mk,kn->mn", xb, jnp.asarray(w))),
                                  np.asarray(jnp.einsum("mk,kn->mn", xb, jnp.asarray(w))))
    wb = jnp.asarray(w, jnp.bfloat16)
    monkeypatch.setattr(jax, "default_backend", lambda: "gpu")
    assert str(jax.make_jaxpr(dots.dot)(xb, wb)) == str(jax.make_jaxpr(jnp.dot)(xb, wb))


def _saved(fn, *args) -> list[str]:
    """jax's printed residuals of `fn` (one line each: dtype[shape] and where it comes from)."""
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        print_saved_residuals(fn, *args)
    return out.getvalue().splitlines()


def test_remat_dots_policies_save_the_bf16_product():
    x, w = (jnp.asarray(a, jnp.bfloat16) for a in _operands((2, 8, 16), (16, 24)))
    e = jnp.asarray(_operands((3, 24, 8), (1,))[0], jnp.bfloat16)

    def f(x, w, e):
        h = jnp.sin(dots.einsum("btd,df->btf", x, w))
        return jnp.sum(jnp.sin(dots.einsum("btf,efr->bter", h, e)).astype(jnp.float32))

    for name in ("dots", "dots_no_batch"):
        saved = _saved(jax.checkpoint(f, policy=_REMAT[name]()), x, w, e)
        assert saved and all(line.startswith("bf16[") for line in saved), saved
        assert sum(f"'{dots.DOTS}'" in line for line in saved) == 2
