"""CEA estimation (dart_jax/analysis/cea.py): exact recovery, the design's contrasts, drop and clip
rules, estimators, seeded bootstraps. Tolerances: 1e-9 for exact linear algebra in float64."""

import json

import numpy as np
import pytest

from dart_jax.analysis import cea


def _counts(k, n):
    k, n = np.asarray(k, np.float64), np.broadcast_to(np.asarray(n, np.float64), np.shape(k)).copy()
    return cea.Counts(tuple(f"q{i}" for i in range(len(k))), k, n)


def test_design_full_rank_and_contrasts():
    assert np.linalg.matrix_rank(cea.DESIGN) == 6
    z = np.random.default_rng(0).normal(size=(50, 6))
    b = cea.solve(z)
    B, R, T, U, HT, HR = (z[:, i] for i in range(6))
    want = np.stack([B, HT - B, HR - B, T - HT, R - HR, U - T - R + B], 1)
    np.testing.assert_allclose(b, want, atol=1e-9)
    # β23 does not depend on the compositions: moving H_Tool / H_Reas leaves it unchanged
    z2 = z.copy()
    z2[:, 4:] += 3.0
    np.testing.assert_allclose(cea.solve(z2)[:, 5], b[:, 5], atol=1e-9)


def test_recovers_known_beta_from_synthetic_accuracy():
    beta = np.random.default_rng(1).normal(scale=0.8, size=(40, 6))
    y = 1 / (1 + np.exp(-(beta @ cea.DESIGN.T)))  # s_q^M = sigmoid(x^M · β_q)
    np.testing.assert_allclose(cea.solve(cea.logit(y)), beta, atol=1e-9)
    # through counts: with k / n exactly y (n large, y rounded to the grid) the estimate is exact
    n = 10 ** 6
    k = np.round(y * n)
    est = cea.estimate(_counts(k, n))
    np.testing.assert_allclose(est.beta, cea.solve(cea.logit(k / n)), atol=1e-9)
    np.testing.assert_allclose(est.beta, beta, atol=1e-3)


def test_clip_drop_and_jeffreys():
    k = np.array([[0, 0, 0, 0, 0, 0],       # never answered: dropped
                  [0, 0, 0, 50, 0, 0],      # only M_Unified answers
                  [50, 50, 50, 50, 50, 50],  # always right
                  [10, 20, 30, 40, 25, 35]])
    c = _counts(k, 50)
    est = cea.estimate(c)
    assert est.dropped == 1 and est.ids == ("q1", "q2", "q3")
    e = 1e-4
    L0, L1 = np.log(e / (1 - e)), np.log((1 - e) / e)
    np.testing.assert_allclose(est.y[0], [e, e, e, 1 - e, e, e])
    # hand-worked: β23 = z_U − z_T − z_R + z_B = L1 − L0 − L0 + L0
    assert est.beta[0, 5] == pytest.approx(L1 - L0, rel=1e-12)
    np.testing.assert_allclose(est.beta[1], [L1, 0, 0, 0, 0, 0], atol=1e-9)
    j = cea.estimate(c, "jeffreys")
    np.testing.assert_allclose(j.y[0], [0.5 / 51] * 3 + [50.5 / 51] + [0.5 / 51] * 2)
    # hand-worked: logit(50.5/51) − logit(0.5/51) = 2 log 101 ≈ 9.23, half the clipped 2 log 9999 ≈ 18.42
    assert j.beta[0, 5] == pytest.approx(2 * np.log(101), rel=1e-12)
    assert est.beta[0, 5] == pytest.approx(2 * np.log(9999), rel=1e-9)
    with pytest.raises(ValueError, match="estimator"):
        cea.accuracy(k, 50, "ml")
    with pytest.raises(ValueError, match=r"\[0, n\]"):
        _counts(k + 60, 50)


def test_counts_from_rows_join_and_errors():
    rows = {v: [{"dataset": "nq", "id": str(i), "n": 8, "correct": (i + j) % 9} for i in range(3)]
            for j, v in enumerate(cea.VARIANTS)}
    c = cea.counts_from_rows(rows)
    assert c.ids == ("nq/0", "nq/1", "nq/2") and c.k[1].tolist() == [1, 2, 3, 4, 5, 6]
    with pytest.raises(ValueError, match="missing \\['h_reas'\\]"):
        cea.counts_from_rows({v: r for v, r in rows.items() if v != "h_reas"})
    bad = dict(rows, tool=rows["tool"][:2])
    with pytest.raises(ValueError, match="'tool' covers different questions"):
        cea.counts_from_rows(bad)
    with pytest.raises(ValueError, match="appears twice"):
        cea.counts_from_rows(dict(rows, base=rows["base"] + rows["base"][:1]))


def test_summary_bootstrap_seeded_and_sign_test():
    rng = np.random.default_rng(2)
    beta = rng.normal(size=(60, 6))
    beta[:, 5] = -np.abs(beta[:, 5])  # every β23 negative
    beta[:3, 5] = 0.0
    s1 = cea.summarize(beta, n_boot=2000, seed=7)
    s2 = cea.summarize(beta, n_boot=2000, seed=7)
    assert s1 == s2
    assert cea.summarize(beta, n_boot=2000, seed=8)["b1"]["mean_ci"] != s1["b1"]["mean_ci"]
    b23 = s1["b23"]
    assert (b23["negative"], b23["positive"], b23["zero"]) == (57, 0, 3)
    assert b23["share_negative"] == pytest.approx(57 / 60)
    assert b23["sign_test_p"] == pytest.approx(2 * 0.5 ** 57)
    for c in cea.COEFS:  # the point estimate lies inside its percentile interval
        lo, hi = s1[c]["mean_ci"]
        assert lo <= s1[c]["mean"] <= hi
    # the interval of a mean shrinks like 1/sqrt(Q): compare with the normal approximation
    se = beta[:, 0].std(ddof=1) / np.sqrt(60)
    width = s1["b1"]["mean_ci"][1] - s1["b1"]["mean_ci"][0]
    assert width == pytest.approx(2 * 1.96 * se, rel=0.15)


def test_sampling_bootstrap_carries_answer_noise():
    # 40 identical questions: resampling questions alone cannot move the share (its interval is a
    # point); drawing each accuracy from its posterior can; with many answers it collapses again
    row = np.array([0.5, 0.75, 0.75, 0.75, 0.625, 0.625])  # β23 = z_U − z_T − z_R + z_B = −logit(.75)
    assert cea.solve(cea.logit(row))[5] < 0
    out = {}
    for n in (8, 5000):
        c = _counts(np.tile(np.round(row * n), (40, 1)), n)
        est = cea.estimate(c)
        assert cea.summarize(est.beta, n_boot=500)["b23"]["share_negative_ci"] == [1.0, 1.0]
        r = cea.sampling_bootstrap(c, n_boot=500, seed=0)
        assert r == cea.sampling_bootstrap(c, n_boot=500, seed=0)  # seeded
        assert r["questions"] == 40 and r["ci"][0] <= r["median"] <= r["ci"][1]
        out[n] = r
    assert out[8]["ci"][0] < 0.8  # 8 answers per accuracy: the sign of β23 is uncertain for many questions
    assert out[5000]["ci"][0] > 0.95
    # the true share is recovered: accuracies drawn per question from known β, β23 < 0 for 3 in 4
    rng = np.random.default_rng(5)
    beta = rng.normal(scale=0.5, size=(400, 6))
    beta[:, 5] = np.where(np.arange(400) % 4 == 0, 1.0, -1.0)
    y = 1 / (1 + np.exp(-(beta @ cea.DESIGN.T)))
    r = cea.sampling_bootstrap(_counts(rng.binomial(400, y), 400), n_boot=500, seed=1)
    assert r["ci"][0] <= 0.75 <= r["ci"][1]
    with pytest.raises(ValueError, match="integer"):
        cea.sampling_bootstrap(_counts(np.full((2, 6), 0.5), 1))


def test_ties_give_exact_zeros():
    z = cea.logit(np.array([[0.3, 0.6, 0.6, 0.3, 0.3, 0.6],     # U = B and T = R: β23 = 2(z.3 − z.6)
                            [0.3, 0.3, 0.6, 0.6, 0.3, 0.6],     # U = T and R = B: β23 = 0 exactly
                            [0.7, 0.2, 0.7, 0.2, 0.7, 0.2]]))  # U = R and T = B: 0 exactly
    b = cea.solve(np.tile(z, (7, 1)))
    assert (b[1::3, 5] == 0.0).all() and (b[2::3, 5] == 0.0).all() and (b[0::3, 5] < 0).all()
    np.testing.assert_allclose(cea.solve(z), np.linalg.solve(cea.DESIGN, z.T).T, atol=1e-12)


def test_accuracy_bins():
    beta = np.zeros((4, 6))
    beta[:, 5] = [-2.0, -1.9, 1.0, 2.0]
    bins = cea.accuracy_bins(beta, np.array([0.9, 0.7, 0.1, 0.3]), bins=2)
    assert [b["count"] for b in bins] == [2, 2]
    assert bins[0]["mean_accuracy"] == pytest.approx(0.8) and bins[1]["mean_accuracy"] == pytest.approx(0.2)


def _write_variant_dirs(root, k, n):
    """Six evaluation-like directories, each with launch.evaluate's per_question_accuracy.jsonl."""
    import json
    import os
    for j, v in enumerate(cea.VARIANTS):
        os.makedirs(root / v)
        with open(root / v / "per_question_accuracy.jsonl", "w") as f:
            for i in range(len(k)):
                f.write(json.dumps({"dataset": "nq", "id": str(i), "question": f"q {i}?", "n": int(n),
                                    "correct": float(k[i, j]), "accuracy": k[i, j] / n}) + "\n")


def test_launch_cea_solve_end_to_end(tmp_path, capsys):
    import json

    from launch import cea as cli
    rng = np.random.default_rng(4)
    beta = rng.normal(scale=0.6, size=(30, 6))
    k = rng.binomial(16, 1 / (1 + np.exp(-(beta @ cea.DESIGN.T))))
    k[0] = 0  # dropped
    _write_variant_dirs(tmp_path / "acc", k, 16)
    out = tmp_path / "solve"
    assert cli.main([f"--inputs={tmp_path / 'acc'}", f"--out={out}", "--n-boot=500"]) == 0
    assert "29 questions kept (1 dropped)" in capsys.readouterr().out
    s = json.load(open(out / "summary.json"))
    want = cea.estimate(cea.Counts(tuple(f"nq/{i}" for i in range(30)), k.astype(float), np.full((30, 6), 16.0)))
    assert s["kept"] == 29 and s["dropped"] == 1
    assert s["clip"]["b23"]["mean"] == pytest.approx(want.beta[:, 5].mean(), rel=1e-12)
    assert set(s["jeffreys"]) >= set(cea.COEFS) and s["true_accuracy_b23"]["n_boot"] == 500
    rows = [json.loads(x) for x in open(out / "per_question.jsonl")]
    assert len(rows) == 30 and rows[0]["kept"] is False and "beta_clip" not in rows[0]
    lines = open(out / "beta.csv").read().splitlines()
    assert len(lines) == 30 and lines[0].startswith("id,b1,b2,b3,b12,b13,b23")
    for png in ("beta23_hist.png", "interactions.png", "beta23_vs_accuracy.png"):
        assert (out / png).stat().st_size > 5000
    report = open(out / "report.md").read()
    assert "| b23 |" in report and "jeffreys" in report and "beta23_hist.png" in report
    # variant=PATH form; a missing variant is named
    args = [f"--inputs={v}={tmp_path / 'acc' / v}" for v in cea.VARIANTS if v != "h_tool"]
    with pytest.raises(ValueError, match="missing \\['h_tool'\\]"):
        cli.main(args + [f"--out={tmp_path / 'x'}", "--n-boot=100"])


def test_interference_from_four_variants_is_the_full_solves_beta23(tmp_path):
    rng = np.random.default_rng(5)
    k = rng.integers(1, 8, size=(30, 6)).astype(np.float64)  # every question answered by every variant
    n = np.full_like(k, 8.0)
    single = [cea.VARIANTS.index(v) for v in cea.SINGLE]
    for e in cea.ESTIMATORS:
        full = cea.estimate(cea.Counts(tuple(f"q{i}" for i in range(30)), k, n), e)
        keep, b23 = cea.interference(k[:, single], n[:, single], e)
        assert keep.all()
        np.testing.assert_allclose(b23, full.beta[:, cea.COEFS.index("b23")], atol=1e-12)
    # the drop rule sees the four variants: a question only a composition answered is dropped here
    k2 = np.zeros((2, 6))
    k2[0, cea.VARIANTS.index("h_tool")] = 3
    k2[1, cea.VARIANTS.index("unified")] = 3
    keep, b23 = cea.interference(k2[:, single], np.full((2, 4), 8.0))
    assert keep.tolist() == [False, True] and len(b23) == 1
    with pytest.raises(ValueError, match=r"\[Q, 4\]"):
        cea.interference(k, n)
    with pytest.raises(ValueError, match="columns"):
        cea.summarize(np.zeros((3, 2)), n_boot=10)
    # the report from files: β23 only, both estimators, the true-accuracy interval, two figures
    from dart_jax.analysis.cea_report import interference_and_report
    inputs = {}
    for j, v in enumerate(cea.SINGLE):
        path = tmp_path / f"{v}.jsonl"
        path.write_text("".join(json.dumps({"dataset": "nq", "id": f"q{i}", "n": 8, "correct": float(k[i, single[j]])})
                                + "\n" for i in range(30)))
        inputs[v] = str(path)
    s = interference_and_report(inputs, str(tmp_path / "out"), n_boot=200, seed=1)
    assert s["kept"] == 30 and s["coefficients"] == ["b23"]
    want = cea.interference(k[:, single], n[:, single])[1]
    assert s["clip"]["b23"]["mean"] == pytest.approx(want.mean(), rel=1e-12)
    assert 0 <= s["true_accuracy_b23"]["ci"][0] <= s["true_accuracy_b23"]["ci"][1] <= 1
    for f in ("report.md", "beta.csv", "per_question.jsonl", "beta23_hist.png", "beta23_vs_accuracy.png"):
        assert (tmp_path / "out" / f).is_file()
    del inputs["tool"]
    with pytest.raises(ValueError, match="missing 'tool'"):
        interference_and_report(inputs, str(tmp_path / "o2"))
