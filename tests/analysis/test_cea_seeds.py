"""CEA pooled over training seeds (dart_jax/analysis/cea_seeds.py): the seed- and question-mean of β by
hand, the seeds × questions bootstrap against the same draws in plain loops, decided signs, the seed
noise floor and the lab's cells. Tolerances: 1e-12 for exact float64 arithmetic."""

import numpy as np
import pytest

from dart_jax.analysis import cea, cea_seeds


def _counts(k, n=8.0, ids=("q0", "q1", "q2")):
    k = np.asarray(k, np.float64)
    return cea.Counts(tuple(ids), k, np.full_like(k, n))


# variants: base, reas, tool, unified, h_tool, h_reas
K0 = [[2, 4, 3, 1, 2, 4], [0, 0, 0, 0, 0, 0], [5, 5, 6, 7, 5, 5]]
K1 = [[2, 5, 3, 2, 2, 5], [0, 0, 0, 0, 0, 0], [5, 6, 6, 6, 5, 6]]


def test_pooled_beta_by_hand():
    s = cea_seeds.pooled({0: _counts(K0), 1: _counts(K1)}, "jeffreys", n_boot=500, cells={"q0": "h2/x", "q2": "h3/y"})
    assert (s["seeds"], s["questions"], s["kept"], s["dropped"]) == ([0, 1], 3, 2, 1)  # q1: never answered
    y = lambda k: (k + 0.5) / 9.0  # noqa: E731  Jeffreys with n = 8
    z = lambda k: np.log(y(k)) - np.log1p(-y(k))  # noqa: E731
    b23 = lambda r: (z(r[3]) - z(r[2])) - (z(r[1]) - z(r[0]))  # noqa: E731
    want = [[b23(np.array(K[q], float)) for q in (0, 2)] for K in (K0, K1)]
    assert s["seed_means"]["b23"] == pytest.approx(np.mean(want, 1), abs=1e-12)
    assert s["coefficients"]["b23"]["mean"] == pytest.approx(np.mean(want), abs=1e-12)
    lo, hi = s["coefficients"]["b23"]["ci"]
    assert lo <= s["coefficients"]["b23"]["mean"] <= hi
    assert s["per_question"][0]["b23"] == pytest.approx([want[0][0], want[1][0]], abs=1e-12)
    # cells: each holds one kept question; a cell's mean is its question's seed mean
    assert [(c["cell"], c["questions"]) for c in s["cells"]] == [("h2/x", 1), ("h3/y", 1)]
    assert s["cells"][1]["mean"] == pytest.approx(np.mean([want[0][1], want[1][1]]), abs=1e-12)
    # the seed noise floor: the placebo (z_U,0 − z_U,1) − (z_R,0 − z_R,1) per kept question
    (noise,) = s["seed_noise"]
    placebo = [(z(1.0) - z(2.0)) - (z(4.0) - z(5.0)), (z(7.0) - z(6.0)) - (z(5.0) - z(6.0))]
    assert noise["mean"] == pytest.approx(np.mean(placebo), abs=1e-12)
    assert noise["sd"] == pytest.approx(np.std(placebo, ddof=1), abs=1e-12)
    assert s["b23_spread"]["seed_means_sd"] == pytest.approx(np.std(np.mean(want, 1), ddof=1), abs=1e-12)
    # the seeds' t interval: mean ± t(0.975, 1) · sd / √2
    m = np.mean(want, 1)
    half = 12.706204736174707 * np.std(m, ddof=1) / np.sqrt(2)
    assert s["coefficients"]["b23"]["seed_t_ci"] == pytest.approx([m.mean() - half, m.mean() + half], abs=1e-9)
    md = cea_seeds.report_markdown(s)
    assert "## Seed noise floor" in md and "| h3/y | 1 |" in md


def test_two_way_bootstrap_is_the_plain_loop():
    x = np.array([[1.0, -2.0, 0.5, 3.0], [0.0, 1.0, -1.0, 2.0], [2.0, 2.0, 0.0, -1.0]])
    r = cea_seeds.two_way_bootstrap(x, n_boot=1000, seed=5)
    rng, vals = np.random.default_rng(5), []
    for _ in range(1000):
        si, qi = rng.integers(0, 3, 3), rng.integers(0, 4, 4)
        vals.append(np.mean([[x[s, q] for q in qi] for s in si]))
    assert r["ci"] == pytest.approx(list(np.quantile(vals, [0.025, 0.975])), abs=1e-12)
    assert (r["seeds"], r["questions"], r["mean"]) == (3, 4, pytest.approx(x.mean()))


def test_decided_signs_follow_the_data_not_the_clip():
    # q0: strong negative interaction with many answers; q1: one answer in a few samples everywhere
    k = np.array([[[100, 180, 180, 20, 100, 100], [1, 1, 1, 1, 1, 1]]] * 2, float)
    n = np.array([[[200] * 6, [4] * 6]] * 2, float)
    d = cea_seeds.decided(k, n, draws=2000, seed=0)
    assert (d["negative"], d["positive"], d["undecided"], d["questions"]) == (1, 0, 1, 2)
    assert d["p_negative"][0] > 0.99 and 0.1 < d["p_negative"][1] < 0.9


def test_seeds_on_other_questions_are_refused():
    with pytest.raises(ValueError, match="seed 1 was sampled on other questions"):
        cea_seeds.pooled({0: _counts(K0), 1: _counts(K1, ids=("q0", "q1", "q9"))})
    with pytest.raises(ValueError, match="all 3 questions were dropped"):
        cea_seeds.pooled({0: _counts(np.zeros((3, 6)))})


def test_a_base_sample_shared_by_the_seeds_is_drawn_once():
    """M_Base's 8 answers are one sample every seed reuses: its posterior noise must not average away over
    seeds. The trained variants are near-certain (10^5 answers each), so P(β23 < 0) is M_Base's alone and
    three seeds give what one gives; drawn per seed, the spread would shrink by √3 and P move."""
    N = 100_000.0
    one = np.array([[[4, 0.55 * N, 0.5 * N, 0.52 * N, 0.5 * N, 0.5 * N]]])
    n_one = np.array([[[8, N, N, N, N, N]]])
    k3 = np.concatenate([one, one + [[[0, 10, 0, -10, 0, 0]]], one + [[[0, -10, 0, 10, 0, 0]]]])
    n3 = np.repeat(n_one, 3, 0)
    p1 = cea_seeds.decided(one, n_one, draws=20_000, seed=1)["p_negative"][0]
    p3 = cea_seeds.decided(k3, n3, draws=20_000, seed=2)["p_negative"][0]
    assert 0.2 < p1 < 0.8 and p3 == pytest.approx(p1, abs=0.02)


def test_beta23_from_the_four_single_model_variants_is_the_full_pools():
    """Counts of M_Base / M_Reas / M_Tool / M_Unified alone (a study whose compositions are not sampled yet):
    the same β23, seed means, cells and seed noise as the six-variant pool (no question here is answered by a
    composition alone, so both drop rules keep the same ones); decided signs within Monte Carlo error."""
    four = lambda k: cea.Counts(("q0", "q1", "q2"), np.asarray(k, float)[:, :4], np.full((3, 4), 8.0),  # noqa: E731
                                cea.SINGLE)
    cells = {"q0": "h2/x", "q2": "h3/y"}
    full = cea_seeds.pooled({0: _counts(K0), 1: _counts(K1)}, "jeffreys", n_boot=500, cells=cells)
    b23 = cea_seeds.pooled({0: four(K0), 1: four(K1)}, "jeffreys", n_boot=500, cells=cells)
    assert list(b23["coefficients"]) == ["b23"] and list(b23["variants"]) == list(cea.SINGLE)
    assert b23["coefficients"]["b23"] == pytest.approx(full["coefficients"]["b23"], abs=1e-12)
    assert b23["seed_noise"] == full["seed_noise"] and b23["cells"] == full["cells"]
    assert [q["b23"] for q in b23["per_question"]] == [q["b23"] for q in full["per_question"]]
    k6, n6 = np.stack([_counts(K0).k, _counts(K1).k]), np.full((2, 3, 6), 8.0)
    p6 = cea_seeds.decided(k6, n6, draws=20_000, seed=1)["p_negative"]
    p4 = cea_seeds.decided(k6[..., :4], n6[..., :4], draws=20_000, seed=2)["p_negative"]
    assert p4 == pytest.approx(p6, abs=0.03)  # independent draws: MC sd ≤ 0.005 each
    assert "β23 alone" in cea_seeds.report_markdown(b23)
    with pytest.raises(ValueError, match="has the variants"):
        cea_seeds.pooled({0: _counts(K0), 1: four(K1)})
