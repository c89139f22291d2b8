"""Token sampling against numpy references: argmax (first maximum), the top-k / nucleus filter
(the sort-based definition, float64), two-stage inverse-CDF sampling (chi-square against the
softmax, never a filtered-out token) and the recorded log-prob."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from dart_jax.rollout.sampling import CDF_BLOCK, SamplingConfig, argmax_first, categorical, filter_logits, sample


def _nucleus_reference(z: np.ndarray, top_k: int, top_p: float) -> np.ndarray:
    """bool[B, V] kept: top-k (ties at the k-th value kept), then the smallest prefix of the
    descending sort whose mass (float64 softmax of the top-k-filtered row) reaches top_p, widened
    to every token equal to the last kept value."""
    keep = np.ones(z.shape, bool)
    for r in range(z.shape[0]):
        row = z[r].astype(np.float64)
        if top_k:
            kth = np.sort(row)[::-1][top_k - 1]
            keep[r] &= row >= kth
        if top_p < 1.0:
            zr = np.where(keep[r], row, -np.inf)
            p = np.exp(zr - zr.max())
            p /= p.sum()
            order = np.argsort(-zr, kind="stable")
            before = np.cumsum(p[order]) - p[order]
            cutoff = zr[order][before < top_p].min()
            keep[r] &= zr >= cutoff
    return keep


def test_argmax_first_matches_numpy_with_ties_and_nan():
    rng = np.random.default_rng(0)
    z = rng.normal(size=(6, 1000)).astype(np.float32)
    z[1, [3, 500, 999]] = 9.0            # tie: the first index wins
    z[2, :] = 0.0                         # all equal
    z[3, [7, 8]] = np.inf
    z[4, 10] = np.nan                     # NaN counts as the maximum, as in jnp.argmax
    got = np.asarray(argmax_first(jnp.asarray(z)))
    np.testing.assert_array_equal(got, np.asarray(jnp.argmax(jnp.asarray(z), axis=-1)))
    assert got.tolist()[:5] == [int(np.argmax(z[0])), 3, 0, 7, 10]


@pytest.mark.parametrize("top_k,top_p", [(0, 0.9), (0, 0.5), (0, 0.99), (20, 1.0), (1, 1.0), (50, 0.8)])
def test_filter_matches_sort_based_definition(top_k, top_p):
    rng = np.random.default_rng(top_k * 100 + int(top_p * 100))
    z = (rng.normal(size=(8, 3000)) * rng.uniform(0.5, 4.0, size=(8, 1))).astype(np.float32)
    z[0, :40] = z[0, 40]                  # ties around the cutoffs
    z[1] = np.round(z[1], 1)              # many ties everywhere
    out = np.asarray(filter_logits(jnp.asarray(z), top_k, top_p))
    kept = out > np.finfo(np.float32).min
    ref = _nucleus_reference(z, top_k, top_p)
    # a token whose "mass above" sits within float32 rounding of top_p may fall either way
    np.testing.assert_array_equal(kept, ref)
    np.testing.assert_array_equal(out[kept], z[kept])   # kept logits unchanged


def test_filter_is_jittable_and_keeps_all_when_off():
    z = jnp.asarray(np.random.default_rng(1).normal(size=(3, 700)).astype(np.float32))
    np.testing.assert_array_equal(np.asarray(jax.jit(lambda x: filter_logits(x, 0, 1.0))(z)), np.asarray(z))
    np.testing.assert_array_equal(np.asarray(filter_logits(z, 700, 1.0)), np.asarray(z))


@pytest.mark.parametrize("v", [3 * CDF_BLOCK + 37, 50])
def test_categorical_matches_softmax_distribution(v):
    """200k draws from one row (batched as 2,000 rows × 100 keys): chi-square against softmax(z)
    over tokens with expected count ≥ 5 (the rest pooled), normal approximation z < 4 (a wrong
    block or in-block offset shifts mass by far more); zero-probability tokens never drawn."""
    rng = np.random.default_rng(v)
    z = rng.normal(size=v).astype(np.float32) * 2
    z[::7] = np.finfo(np.float32).min     # filtered-out tokens
    rows = 2000
    zb = jnp.asarray(np.broadcast_to(z, (rows, v)))
    draw = jax.jit(lambda k: categorical(k, zb))
    counts = np.zeros(v, np.int64)
    for i in range(100):
        counts += np.bincount(np.asarray(draw(jax.random.PRNGKey(i))), minlength=v)
    assert counts[::7].sum() == 0
    p = np.exp(z.astype(np.float64) - z.max())
    p[::7] = 0.0
    p /= p.sum()
    n = counts.sum()
    big = p * n >= 5
    rest = (~big) & (p > 0)
    obs = np.concatenate([counts[big], [counts[rest].sum()]])
    exp = np.concatenate([p[big] * n, [p[rest].sum() * n]])
    keep = exp > 0
    chi2 = float(((obs[keep] - exp[keep]) ** 2 / exp[keep]).sum())
    dof = int(keep.sum()) - 1
    assert (chi2 - dof) / np.sqrt(2 * dof) < 4.0, (chi2, dof)


def test_categorical_one_hot_and_edge_blocks():
    v = 2 * CDF_BLOCK + 5
    z = np.full((4, v), np.finfo(np.float32).min, np.float32)
    z[0, 0] = 0.0                          # first token of the first block
    z[1, v - 1] = 0.0                      # last token of the last (padded) block
    z[2, CDF_BLOCK - 1] = 0.0              # last token of a full block
    z[3, [CDF_BLOCK, v - 1]] = 0.0         # two tokens, two blocks
    for seed in range(20):
        tok = np.asarray(categorical(jax.random.PRNGKey(seed), jnp.asarray(z)))
        assert tok[:3].tolist() == [0, v - 1, CDF_BLOCK - 1]
        assert tok[3] in (CDF_BLOCK, v - 1)


@pytest.mark.parametrize("cfg", [SamplingConfig(0.0), SamplingConfig(0.7), SamplingConfig(1.0, top_k=5),
                                 SamplingConfig(1.3, top_p=0.8)])
def test_sample_records_logprob_at_temperature_over_unfiltered_distribution(cfg):
    rng = np.random.default_rng(3)
    logits = rng.normal(size=(5, 400)).astype(np.float32) * 3
    tok, lp = sample(jnp.asarray(logits), jax.random.PRNGKey(0), cfg)
    tok, lp = np.asarray(tok), np.asarray(lp)
    z = logits.astype(np.float64) / cfg.logprob_temperature
    ref = z - (z.max(-1, keepdims=True) + np.log(np.exp(z - z.max(-1, keepdims=True)).sum(-1, keepdims=True)))
    np.testing.assert_allclose(lp, ref[np.arange(5), tok], atol=2e-5)
    if cfg.greedy:
        np.testing.assert_array_equal(tok, logits.argmax(-1))
    kept = _nucleus_reference(z.astype(np.float32), cfg.top_k, cfg.top_p)
    assert kept[np.arange(5), tok].all()   # never a filtered-out token
