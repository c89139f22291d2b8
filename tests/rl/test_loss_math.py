"""Loss math against numpy (written here from REFERENCE §1–5, independently of dart_jax.rl) and
hand-worked values. Tolerance: 1e-6 absolute (fp32) unless stated."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from dart_jax.rl import advantages as adv_lib, losses
from dart_jax.rl.logprobs import token_logprobs
from dart_jax.run.spec import LossConfig

TOL = 1e-6


# ---------------------------------------------------------------- numpy references
def np_grpo(scores, uids, norm_by_std=True, eps=1e-6):
    scores = np.asarray(scores, np.float64)
    out = np.empty_like(scores)
    for u in set(uids):
        idx = [i for i, v in enumerate(uids) if v == u]
        s = scores[idx]
        if len(idx) == 1:
            mean, std = 0.0, 1.0
        else:
            mean, std = s.mean(), s.std(ddof=1)
        out[idx] = (s - mean) / (std + eps) if norm_by_std else s - mean
    return out


def np_kl(lp, ref, kind):
    d = lp - ref
    if kind == "k1":
        return d
    if kind == "abs":
        return np.abs(d)
    if kind == "k2":
        return 0.5 * d * d
    u = np.clip(ref - lp, -20, 20)
    return np.clip(np.exp(u) - u - 1, -10, 10)


def np_pg(lp, old, a, lo=0.2, hi=0.2, c=3.0):
    ratio = np.exp(np.clip(lp - old, -20, 20))
    l1, l2 = -a * ratio, -a * np.clip(ratio, 1 - lo, 1 + hi)
    lc = np.maximum(l1, l2)
    return np.where(a < 0, np.minimum(-a * c, lc), lc)


def np_agg(x, m, mode, L=None):
    """REFERENCE §5 in numpy; L = seq-mean-token-sum-norm's configured maximum response length."""
    if mode == "token-mean":
        return (x * m).sum() / m.sum()
    rows = m.sum(-1) > 0
    if mode == "seq-mean-token-sum":
        return (x * m).sum(-1)[rows].mean()
    if mode == "seq-mean-token-mean":
        return ((x * m).sum(-1)[rows] / m.sum(-1)[rows]).mean()
    return (x * m).sum() / L


# ---------------------------------------------------------------- advantages
def test_grpo_hand_worked():
    # group a: scores 1, 0, 0 -> mean 1/3, unbiased std sqrt(1/3); group b alone; group c all equal
    uids = ["a", "a", "a", "b", "c", "c"]
    scores = [1.0, 0.0, 0.0, 0.7, 2.0, 2.0]
    ids, n = adv_lib.group_index(uids)
    got = np.asarray(adv_lib.grpo_advantages(jnp.asarray(scores), jnp.asarray(ids), n))
    std = np.sqrt(1 / 3)
    expect = [(2 / 3) / (std + 1e-6), (-1 / 3) / (std + 1e-6), (-1 / 3) / (std + 1e-6), 0.7 / (1 + 1e-6), 0, 0]
    np.testing.assert_allclose(got, expect, atol=1e-5)
    assert got[4] == 0.0 and got[5] == 0.0  # all-equal group: exactly 0


@pytest.mark.parametrize("norm", [True, False])
def test_grpo_random_vs_numpy(norm):
    rng = np.random.default_rng(0)
    uids = [f"q{k}" for k in rng.integers(0, 7, 64)]
    scores = rng.normal(size=64).astype(np.float32)
    ids, n = adv_lib.group_index(uids)
    got = np.asarray(adv_lib.grpo_advantages(jnp.asarray(scores), jnp.asarray(ids), n, norm_by_std=norm))
    np.testing.assert_allclose(got, np_grpo(scores, uids, norm), atol=1e-5, rtol=1e-5)


def test_group_index_uses_uids_not_positions():
    ids, n = adv_lib.group_index(["nq_0", "hotpot_0", "nq_0", "hotpot_0"])
    assert n == 2 and ids.tolist() == [0, 1, 0, 1]


# ---------------------------------------------------------------- KL
@pytest.mark.parametrize("kind", losses.KL_TYPES)
def test_kl_vs_numpy(kind):
    rng = np.random.default_rng(1)
    lp, ref = rng.normal(-2, 1, (4, 9)), rng.normal(-2, 1, (4, 9))
    got = np.asarray(losses.kl_penalty(jnp.asarray(lp, jnp.float32), jnp.asarray(ref, jnp.float32), kind))
    np.testing.assert_allclose(got, np_kl(lp, ref, kind), atol=1e-5, rtol=1e-5)


def test_k3_clamp_edges():
    # u = ref − lp = 30 -> clamped to 20; exp(20) − 21 > 10 -> 10.  u = −30 -> −20: e^−20 + 19 > 10 -> 10.
    lp = jnp.asarray([-40.0, 0.0, -1.0])
    ref = jnp.asarray([-10.0, -30.0, -1.0])
    got = np.asarray(losses.kl_penalty(lp, ref, "k3"))
    np.testing.assert_allclose(got, [10.0, 10.0, 0.0], atol=TOL)
    # u = 2: e^2 − 3 = 4.389 (inside the clamps)
    np.testing.assert_allclose(float(losses.kl_penalty(jnp.asarray(-3.0), jnp.asarray(-1.0), "k3")),
                               np.exp(2) - 3, rtol=1e-6)
    # unclamped (Search-R1's older verl): no ±10
    assert float(losses.kl_penalty(jnp.asarray(-40.0), jnp.asarray(-10.0), "k3", clamp=False)) > 1e12


# ---------------------------------------------------------------- clipped loss
def test_clipped_loss_hand_worked():
    # A = +1, ratio e^0.5 = 1.6487 > 1.2 -> clipped: max(−1.6487, −1.2) = −1.2, clipfrac 1
    # A = −1, ratio e^0.5: max(1.6487, 1.2) = 1.6487 < 3 -> 1.6487
    # A = −1, ratio e^2 = 7.389: Lclip 7.389 > L3 = 3 -> dual clip 3, clipfrac_lower 1
    # A = +1, ratio e^−0.5 = 0.6065 < 0.8: max(−0.6065, −0.8) = −0.6065 (not clipped)
    lp = jnp.asarray([0.5, 0.5, 2.0, -0.5])
    old = jnp.zeros(4)
    a = jnp.asarray([1.0, -1.0, -1.0, 1.0])
    loss, ind = losses.clipped_policy_loss(lp, old, a)
    np.testing.assert_allclose(np.asarray(loss), [-1.2, np.exp(0.5), 3.0, -np.exp(-0.5)], rtol=1e-6)
    assert np.asarray(ind["clipped"]).tolist() == [1, 0, 0, 0]
    assert np.asarray(ind["clipped_lower"]).tolist() == [0, 0, 1, 0]
    np.testing.assert_allclose(np.asarray(ind["ppo_kl"]), [-0.5, -0.5, -2.0, 0.5], atol=TOL)


def test_clipped_loss_ratio_clamp_edge():
    # Δ = 50 is clamped to 20 before exp: the loss stays finite
    loss, _ = losses.clipped_policy_loss(jnp.asarray([50.0]), jnp.asarray([0.0]), jnp.asarray([1.0]),
                                         dual_clip=None)
    assert float(loss[0]) == pytest.approx(-1.2)
    loss, _ = losses.clipped_policy_loss(jnp.asarray([-50.0]), jnp.asarray([0.0]), jnp.asarray([-1.0]))
    assert np.isfinite(float(loss[0])) and float(loss[0]) == pytest.approx(0.8)


def test_clipped_loss_random_vs_numpy():
    rng = np.random.default_rng(2)
    lp, old = rng.normal(0, 0.5, (5, 11)), rng.normal(0, 0.5, (5, 11))
    a = rng.normal(0, 1, (5, 1))
    got, _ = losses.clipped_policy_loss(jnp.asarray(lp, jnp.float32), jnp.asarray(old, jnp.float32),
                                        jnp.asarray(a, jnp.float32), 0.2, 0.28, 3.0)
    np.testing.assert_allclose(np.asarray(got), np_pg(lp, old, a, 0.2, 0.28, 3.0), atol=1e-5, rtol=1e-5)


# ---------------------------------------------------------------- aggregation
@pytest.mark.parametrize("mode", losses.AGG_MODES)
def test_aggregation_vs_numpy_with_empty_row(mode):
    rng = np.random.default_rng(3)
    x = rng.normal(size=(4, 10))
    m = (rng.random((4, 10)) > 0.4).astype(np.float64)
    m[2] = 0.0  # a fully masked row: excluded from the seq-mean denominators
    got = float(losses.aggregate(jnp.asarray(x, jnp.float32), jnp.asarray(m, jnp.float32), mode, 16))
    assert got == pytest.approx(np_agg(x, m, mode, 16), rel=1e-5, abs=1e-6)


def test_aggregation_hand_worked():
    x = np.asarray([[1.0, 2.0, 3.0], [4.0, 0.0, 0.0]])
    m = np.asarray([[1.0, 1.0, 0.0], [1.0, 0.0, 0.0]])
    vals = {mode: float(losses.aggregate(jnp.asarray(x), jnp.asarray(m), mode, 8)) for mode in losses.AGG_MODES}
    assert vals["token-mean"] == pytest.approx(7 / 3)
    assert vals["seq-mean-token-sum"] == pytest.approx((3 + 4) / 2)
    assert vals["seq-mean-token-mean"] == pytest.approx((1.5 + 4) / 2)
    assert vals["seq-mean-token-sum-norm"] == pytest.approx(7 / 8)  # L = the configured response length 8


def test_sum_norm_divides_by_the_configured_length_not_the_array_width():
    """verl: Σ m·ℓ / loss_mask.shape[-1] over response arrays padded to the configured maximum
    response length — a constant. Padding our arrays wider (a longer prompt, another pad bucket)
    must not change it; without a configured length the mode refuses."""
    x = np.asarray([[1.0, 2.0, 3.0], [4.0, 0.0, 0.0]])
    m = np.asarray([[1.0, 1.0, 0.0], [1.0, 0.0, 0.0]])
    wide_x, wide_m = np.pad(x, ((0, 0), (5, 60))), np.pad(m, ((0, 0), (5, 60)))
    for a, b in ((x, m), (wide_x, wide_m)):
        assert float(losses.aggregate(jnp.asarray(a), jnp.asarray(b), "seq-mean-token-sum-norm", 512)) \
            == pytest.approx(7 / 512)
    with pytest.raises(ValueError, match="maximum response length"):
        losses.aggregate(jnp.asarray(x), jnp.asarray(m), "seq-mean-token-sum-norm")


def test_fully_masked_batch_aggregates_to_zero():
    for mode in losses.AGG_MODES[:3]:
        assert float(losses.aggregate(jnp.ones((2, 3)), jnp.zeros((2, 3)), mode)) == 0.0


@pytest.mark.parametrize("mode", losses.AGG_MODES)
def test_micro_batch_carry_global_and_verl(mode):
    """Split into 3 micro-batches: 'global' reproduces the whole-batch aggregate; verl's mode is the
    mean of the per-micro-batch aggregates."""
    rng = np.random.default_rng(4)
    x = rng.normal(size=(6, 8))
    m = (rng.random((6, 8)) > 0.5).astype(np.float64)
    m[1] = 0
    xs, ms = x.reshape(3, 2, 8), m.reshape(3, 2, 8)
    parts = [losses.aggregation_weights(jnp.asarray(mm), mode, 20) for mm in ms]
    dens = jnp.stack([d for _, d in parts])
    for micro_mode, expect in (("global", np_agg(x, m, mode) if mode != "seq-mean-token-sum-norm"
                                else (x * m).sum() / (3 * 20)),
                               ("verl_microbatch_mean", np.mean([np_agg(a, b, mode, 20) for a, b in zip(xs, ms)]))):
        c = np.asarray(losses.micro_scales(dens, micro_mode))
        total = sum(c[i] * float(jnp.sum(parts[i][0] * xs[i])) for i in range(3))
        assert total == pytest.approx(expect, rel=1e-5), micro_mode


# ---------------------------------------------------------------- log-probs and entropy
@pytest.mark.parametrize("chunk", [1, 3, 7, 64])
def test_chunked_logprobs_entropy_vs_numpy(chunk):
    rng = np.random.default_rng(5)
    b, t, d, v, temp = 2, 9, 6, 13, 0.7
    h = rng.normal(size=(b, t, d)).astype(np.float32)
    head = rng.normal(size=(d, v)).astype(np.float32)
    tokens = rng.integers(0, v, (b, t))
    lp, ent = token_logprobs(jnp.asarray(h), jnp.asarray(head), jnp.asarray(tokens, jnp.int32), temp, chunk)
    z = (h.astype(np.float64) @ head) / temp
    z = z - z.max(-1, keepdims=True)
    logsm = z - np.log(np.exp(z).sum(-1, keepdims=True))
    expect_lp = np.zeros((b, t))
    expect_lp[:, 1:] = np.take_along_axis(logsm[:, :-1], tokens[:, 1:, None], -1)[..., 0]
    p = np.exp(logsm)
    expect_ent = np.zeros((b, t))
    expect_ent[:, 1:] = -(p * logsm).sum(-1)[:, :-1]
    np.testing.assert_allclose(np.asarray(lp), expect_lp, atol=1e-5)
    np.testing.assert_allclose(np.asarray(ent), expect_ent, atol=1e-5)


def test_chunked_logprobs_gradient_matches_unchunked():
    rng = np.random.default_rng(6)
    h = jnp.asarray(rng.normal(size=(2, 10, 5)), jnp.float32)
    head = jnp.asarray(rng.normal(size=(5, 11)), jnp.float32)
    tokens = jnp.asarray(rng.integers(0, 11, (2, 10)), jnp.int32)

    def f(h, head, chunk):
        lp, ent = token_logprobs(h, head, tokens, 1.3, chunk)
        return jnp.sum(lp * 0.7 + ent * 0.3)

    g1 = jax.grad(f, argnums=(0, 1))(h, head, 3)
    g2 = jax.grad(f, argnums=(0, 1))(h, head, 100)
    for a, b in zip(g1, g2):
        np.testing.assert_allclose(np.asarray(a), np.asarray(b), atol=1e-5)


@pytest.mark.parametrize("residual", ["recompute", "logits", "autodiff"])
@pytest.mark.parametrize("dtype", [jnp.float32, jnp.bfloat16])
def test_logprob_gradients_by_hand_match_autodiff_of_log_softmax(residual, dtype):
    """The hand-written backward (rl/logprobs.py: dz = g_lp (onehot − p) − g_H p (z − S)) against JAX
    differentiating the textbook formula over the whole sequence at once; both the hidden states' and
    the head's gradient, weights on log-probs and entropy both non-zero, a padded last chunk.
    Tolerance: fp32 2e-5 absolute (gradients are O(1)); bf16 inputs 2e-2 relative to the largest."""
    rng = np.random.default_rng(7)
    b, t, d, v, temp = 2, 12, 8, 37, 1.3
    h = jnp.asarray(rng.normal(size=(b, t, d)), dtype)
    head = jnp.asarray(rng.normal(size=(d, v)) * 0.5, dtype)
    tokens = jnp.asarray(rng.integers(0, v, (b, t)), jnp.int32)
    w_lp = jnp.asarray(rng.normal(size=(b, t - 1)), jnp.float32)
    w_ent = jnp.asarray(rng.normal(size=(b, t - 1)), jnp.float32)

    def ours(h, head):
        lp, ent = token_logprobs(h, head, tokens, temp, 5, residual)
        return jnp.sum(lp[:, 1:] * w_lp) + jnp.sum(ent[:, 1:] * w_ent)

    def textbook(h, head):
        z = jnp.einsum("btd,dv->btv", h[:, :-1].astype(jnp.float32), head.astype(jnp.float32)) / temp
        ls = jax.nn.log_softmax(z, -1)
        lp = jnp.take_along_axis(ls, tokens[:, 1:, None], -1)[..., 0]
        return jnp.sum(lp * w_lp) - jnp.sum(jnp.sum(jnp.exp(ls) * ls, -1) * w_ent)

    got = jax.grad(ours, (0, 1))(h, head)
    want = jax.grad(textbook, (0, 1))(h, head)
    for g, w in zip(got, want):
        assert g.dtype == dtype
        g, w = np.asarray(g, np.float32), np.asarray(w, np.float32)
        if dtype == jnp.float32:
            np.testing.assert_allclose(g, w, atol=2e-5)
        else:
            assert np.abs(g - w).max() <= 2e-2 * np.abs(w).max()


def test_logprob_residual_is_checked():
    with pytest.raises(ValueError, match="residual"):
        token_logprobs(jnp.zeros((1, 2, 3)), jnp.zeros((3, 4)), jnp.zeros((1, 2), jnp.int32), 1.0, 8, "saved")
    with pytest.raises(ValueError, match="logprob_residual"):
        LossConfig(logprob_residual="saved")


def test_logprob_temperature_must_be_positive():
    with pytest.raises(ValueError, match="temperature"):
        token_logprobs(jnp.zeros((1, 2, 3)), jnp.zeros((3, 4)), jnp.zeros((1, 2), jnp.int32), 0.0)
