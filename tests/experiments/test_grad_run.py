"""`launch.grad_angles` on a tiny random Llama with SmolLM2's real tokenizer and the real retriever:
the sample stage (real rollouts, resampling on a changed setting), then the grads and report stages
on a hand-made group with mixed outcomes (a random model answers nothing right), held against direct
per-role passes: the paper protocol's Gram-derived angles equal angles of separately computed gradient
trees (advantage weighting from the log-likelihood Gram by sign, as the module derives it), the sketch
agrees with the exact Gram, the authors' statistics equal direct passes over their 5-subsets.
Tolerances: 1e-3° for exact angles (fp32 gradients, float64 sums); 2° for the sketch."""

import csv
import json
import os

import jax.numpy as jnp
import numpy as np
import pytest

from configs import grad_angles_quickstart
from dart_jax.adapters.method import MethodSpec
from dart_jax.analysis import grad_angles as ga
from dart_jax.analysis.grad_angles import flip, mixed, paper_pairs, pick_subset
from dart_jax.experiments.grad_roles import RoleGradients
from dart_jax.experiments.grad_run import Study
from dart_jax.rl.advantages import grpo_advantages
from dart_jax.roles.router import RouterSpec
from dart_jax.rollout.protocol import QA, tag_variants
from dart_jax.rollout.tasks import qa_task
from dart_jax.tokenization.sentinels import sentinel_ids
from launch import grad_angles as launch_ga


def _config(model_dir, out, **kw):
    c = grad_angles_quickstart.get_config()
    c.model.path = model_dir
    c.warm_start = ""
    c.rollout.max_turns = 1
    c.rollout.max_tokens_per_turn = 8
    c.rollout.max_obs_tokens = 32
    c.rollout.max_response_tokens = 48
    c.grad_angles.update(dict(out=str(out), limit=3, queries=2, chunk=2, group_size=4, authors_k=3, min_n=2), **kw)
    return c


def test_helpers_on_hand_made_cases():
    assert mixed([1, 0, 0]) and not mixed([0, 0]) and not mixed([1, 1])
    rng = np.random.default_rng(0)
    acc = np.array([0, 0, 1, 0, 0, 0])
    for _ in range(20):
        s = pick_subset(acc, 3, rng)
        assert len(set(s.tolist())) == 3 and 2 in s and (acc[s] == 0).any()
    with pytest.raises(ValueError, match="mixed group"):
        pick_subset(np.zeros(5), 3, rng)
    # advantage weighting: a zero advantage leaves its trajectory out; opposite signs flip same-role pairs
    pairs = paper_pairs(np.ones(6, bool), np.array([1.0, -1.0, 0.0]), "advantage")
    assert pairs["cross"] == [(0, 3, False), (1, 4, False)]
    assert pairs["same_reasoning"] == [(0, 1, True)] and pairs["same_tool"] == [(3, 4, True)]
    loglik = paper_pairs(np.array([1, 1, 1, 1, 0, 1], bool), np.array([1.0, -1.0, 0.0]), "loglik")
    assert [p[:2] for p in loglik["cross"]] == [(0, 3), (2, 5)] and len(loglik["same_reasoning"]) == 3
    assert loglik["same_tool"] == [(3, 5, False)]
    np.testing.assert_allclose(flip([10.0, 30.0], [True, False]), [170.0, 30.0])
    # the role-agnostic control: rows 2G + i and 3G + i, within one trajectory (never flipped)
    assert pairs["control"] == [] and loglik["control"] == []
    ctrl = paper_pairs(np.ones(12, bool), np.array([1.0, -1.0, 0.0]), "advantage")
    assert ctrl["control"] == [(6, 9, False), (7, 10, False)] and ctrl["cross"] == pairs["cross"]
    with pytest.raises(ValueError, match="expected 2G"):
        paper_pairs(np.ones(8, bool), np.array([1.0, -1.0, 0.0]), "loglik")
    # two zero vectors have no angle (a LoRA A factor while B = 0); one zero side is the authors' 90°
    from dart_jax.analysis.grad_report import defined_angle
    got = defined_angle(np.array([0.0, 0.0, 1.0]), np.array([0.0, 1.0, 1.0]), np.array([0.0, 0.0, 1.0]))
    assert np.isnan(got[0]) and got[1] == pytest.approx(90.0) and got[2] == pytest.approx(0.0)


def _group(tok, n=4):
    """A hand-made group: prompt, a search, an observation (not sampled), an answer; right for rows 0, 3."""
    prompts, _, _ = qa_task(tok, [{"id": "q", "question": "what is the capital of france",
                                   "golden_answers": ["paris"]}])
    rows = []
    for i in range(n):
        query = ["capital of france", "france", "paris france capital", "french capital city"][i]
        answer = ["paris", "lyon", "marseille", "paris"][i]
        pieces = [(f"<think>I should look it up {i}</think>\n<search> {query} </search>", 1.0),
                  ("\n\n<information>Doc 1 (Title: Paris) Paris is the capital of France.</information>\n\n", 0.0),
                  (f"<think>the document says so</think>\n<answer> {answer} </answer>", 1.0)]
        ids, mask = list(prompts[0]), [0.0] * len(prompts[0])
        for text, m in pieces:
            t = tok.encode(text, add_special_tokens=False)
            ids += t
            mask += [m] * len(t)
        rows.append((ids, mask))
    width = max(len(r[0]) for r in rows)
    ids = np.zeros((n, width), np.int32)
    pos = np.full((n, width), -1, np.int32)
    lm = np.zeros((n, width), np.float32)
    for i, (r, m) in enumerate(rows):
        ids[i, :len(r)], pos[i, :len(r)], lm[i, :len(r)] = r, np.arange(len(r)), m
    acc = np.array([1.0, 0.0, 0.0, 1.0], np.float32)
    return ids, pos, lm, acc


def _write_chunk(out, ids, pos, lm, acc, uids):
    d = out / "rollouts"
    d.mkdir(parents=True, exist_ok=True)
    g = len(acc)
    np.savez(d / "chunk_000.npz", ids=np.concatenate([ids] * len(uids)), positions=np.concatenate([pos] * len(uids)),
             loss_mask=np.concatenate([lm] * len(uids)), scores=np.concatenate([acc] * len(uids)),
             accuracy=np.concatenate([acc] * len(uids)), uids=np.asarray(uids), group_size=g, seed=0)


def test_report_wall_times_one_line_per_reported_cell():
    from dart_jax.analysis.grad_report import render
    summary = {"setting": {}, "paper": {}, "authors": {}, "files": {},
               "query_seconds": {"full/paper": {"timed": 4, "queries": 4, "total": 480.0},
                                 "adapters/paper": {"timed": 0, "queries": 2, "total": 0.0}},
               "stage_seconds": {"grads": {"full/paper": {"seconds": 120.0}, "adapters/paper": {"seconds": 60.0},
                                           "full/authors": {"seconds": 30.0}},
                                 "report": {"all": {"seconds": 5.0}}}}
    walls = render(summary).split("## Wall time")[1].split("Files:")[0].strip().splitlines()
    # timed queries: their total over every sitting; untimed: the stage's record; not reported: nothing
    assert walls == ["- grads full/paper: 8.0 min over 4 of 4 queries (120 s a query)",
                     "- grads adapters/paper: 60 s", "- report all: 5 s"]


def test_sample_stage_samples_real_rollouts_and_resamples_on_a_changed_setting(tiny_smollm_dir, tmp_path):
    c = _config(tiny_smollm_dir, tmp_path)
    study = Study(c)
    got = study.sample()
    assert got["sampled"] == 3 and got["status"] == "sampled"  # a random model: no mixed group, the pool ends
    groups = study.groups()
    assert [g.ids.shape[0] for g in groups] == [4, 4, 4] and len({g.uid for g in groups}) == 3
    assert all(g.loss_mask.sum() > 0 for g in groups)
    assert Study(c).sample()["status"] == "skipped"  # the pool is exhausted: nothing more to sample
    with pytest.raises(FileNotFoundError, match="no mixed groups.*sample stage"):
        study.grads()
    c2 = _config(tiny_smollm_dir, tmp_path, temperature=0.7, limit=2)
    assert Study(c2).sample()["sampled"] == 2  # sampled again: the saved chunks came from T = 1
    with open(tmp_path / "rollouts" / "settings.json") as f:
        assert json.load(f)["temperature"] == 0.7


def test_the_lab_study_samples_on_the_lab_world_with_the_control_on(tiny_smollm_dir, tmp_path):
    """configs/grad_angles_lab.py end to end at the sample stage: real rollouts on lab world 0's questions with
    the lab's tool set up (lexical index over world 0's corpus; a tiny random model may never call it), the
    control named in its gradient settings."""
    from configs import grad_angles_lab
    c = grad_angles_lab.get_config()
    c.model.path = tiny_smollm_dir
    c.warm_start = ""
    c.rollout.update(max_turns=1, max_tokens_per_turn=8, max_obs_tokens=32, max_response_tokens=48)
    c.grad_angles.update(out=str(tmp_path), limit=2, queries=1, chunk=2, group_size=2)
    study = Study(c)
    assert study.sample()["sampled"] == 2
    groups = study.groups()
    assert [g.uid.split("-q")[0] for g in groups] == ["lab-lab0"] * 2 and all(g.ids.shape[0] == 2 for g in groups)
    assert study.settings()["datasets"] == ["lab_world0"]
    assert study.grad_settings("adapters", "paper")["control"] is True


@pytest.fixture(scope="module")
def studied(tiny_smollm_dir, tmp_path_factory):
    out = tmp_path_factory.mktemp("grad_angles")
    c = _config(tiny_smollm_dir, out)
    study = Study(c)
    tok = study.policy().tokenizer
    ids, pos, lm, acc = _group(tok)
    _write_chunk(out, ids, pos, lm, acc, ["q0", "q1"])
    return c, study, (ids, pos, lm, acc)


def _direct(study, method, tree, weighting, ids, pos, lm, adv, role, tags_in_tool=False):
    pol = study.policy()
    t = sentinel_ids(pol.tokenizer, (QA.tool_open, QA.tool_close))
    router = RouterSpec((t[QA.tool_open],), (t[QA.tool_close],))
    answer = (tuple(tag_variants(pol.tokenizer, QA.answer_open)), tuple(tag_variants(pol.tokenizer, QA.answer_close)))
    rg = RoleGradients(pol.cfg, method, router, weighting, answer_tags=answer, tags_in_tool=tags_in_tool)
    return rg(tree, pol.base, ids, pos, lm, adv, role)[0]


def test_grads_and_report_match_direct_passes_and_resume(studied, capsys):
    c, study, (ids, pos, lm, acc) = studied
    assert study.grads() == {f"{p}/{q}": 2 for p in ("adapters", "full") for q in ("paper", "authors")}
    base = study.policy().base
    adv = np.asarray(grpo_advantages(jnp.asarray(acc), jnp.zeros(4, jnp.int32), 1))
    z = np.load(os.path.join(study.grad_dir("full", "paper"), "q0.npz"))
    assert bool(z["exact"]) and z["present"].all() and (z["tokens"] > 0).all()
    gram = z["gram"]
    # paper protocol, params=full: angles from the Gram = angles of directly computed trees, and the
    # advantage-weighted same-role angle = the angle of advantage-weighted passes
    full = MethodSpec("full")
    reas = [_direct(study, full, base, "advantage", ids[i:i + 1], pos[i:i + 1], lm[i:i + 1], adv[i:i + 1], "reasoning")
            for i in (0, 1)]
    tool0 = _direct(study, full, base, "loglik", ids[:1], pos[:1], lm[:1], adv[:1], "tool")
    tot = gram.sum(0)
    np.testing.assert_allclose(ga.angle(tot[0, 4], tot[0, 0], tot[4, 4]), ga.pair_stats(reas[0], tool0).angle(),
                               atol=1e-3)
    pairs = paper_pairs(z["present"], z["advantages"], "advantage")
    (i, j, f), = [p for p in pairs["same_reasoning"] if p[:2] == (0, 1)]
    assert f  # rows 0 (right) and 1 (wrong) have advantages of opposite sign
    np.testing.assert_allclose(flip([ga.angle(tot[0, 1], tot[0, 0], tot[1, 1])], [f])[0],
                               ga.pair_stats(reas[0], reas[1]).angle(), atol=1e-3)
    # per layer from the Gram = per layer of the trees
    st = ga.pair_stats(reas[0], tool0)
    for layer, want in st.per_layer().items():
        g = gram[z["layers"] == layer].sum(0)
        np.testing.assert_allclose(ga.angle(g[0, 4], g[0, 0], g[4, 4]), want, atol=1e-3)

    # authors' protocol, params=adapters: their statistics = direct passes over the same subsets
    za = np.load(os.path.join(study.grad_dir("adapters", "authors"), "q1.npz"))
    a, _ = za["subset_a"], za["subset_b"]
    assert acc[a].max() == 1 and acc[a].min() == 0 and len(a) == 3
    _, tree, _ = study._role_grads("adapters", "advantage", tags_in_tool=True)
    lora = MethodSpec("lora", rank=16, alpha=32.0)
    adv_a = np.asarray(grpo_advantages(jnp.asarray(acc[a]), jnp.zeros(3, jnp.int32), 1))
    tool_a = _direct(study, lora, tree, "advantage", ids[a], pos[a], lm[a], adv_a, "tool", tags_in_tool=True)
    ans_a = _direct(study, lora, tree, "advantage", ids[a], pos[a], lm[a], adv_a, "answer")
    want = ga.pair_stats(tool_a, ans_a)
    np.testing.assert_allclose(ga.angle(za["advantage_cross_dot"], za["advantage_cross_n1"], za["advantage_cross_n2"]),
                               want.per_unit(), atol=1e-3)
    # the opening tag counts as tool in the authors' mask: the tool gradient differs from the router's
    plain = _direct(study, lora, tree, "advantage", ids[a], pos[a], lm[a], adv_a, "tool")
    assert ga.pair_stats(tool_a, plain).angle() > 1e-3

    # resumable: a query's file is its checkpoint
    os.remove(os.path.join(study.grad_dir("full", "paper"), "q1.npz"))
    assert Study(c).grads() == {"adapters/paper": "skipped", "adapters/authors": "skipped", "full/paper": 1,
                                "full/authors": "skipped"}

    # gradients computed under other settings are computed again, naming the setting
    c3 = c.copy_and_resolve_references()
    c3.grad_angles.authors_k = 4
    assert Study(c3).grads_mismatch("adapters", "authors") == ["authors_k: 3 → 4"]
    assert Study(c3).grads_mismatch("adapters", "paper") == []
    # ... and a report under the changed setting leaves them out rather than mislabel them
    assert Study(c3).report_cells() == [("adapters", "paper"), ("full", "paper")]
    # gradients whose settings are unknown are left out too; rollouts sampled otherwise are an error
    st = os.path.join(Study(c).grad_dir("full", "authors"), "settings.json")
    os.rename(st, st + ".away")
    assert ("full", "authors") not in Study(c).report_cells()
    os.rename(st + ".away", st)
    rs = os.path.join(Study(c).rollout_dir(), "settings.json")  # the chunks here were written by hand
    with open(rs, "w") as f:
        json.dump(Study(c).settings(), f)
    assert Study(c).sample_mismatch() == []
    c4 = c.copy_and_resolve_references()
    c4.grad_angles.temperature = 0.5
    with pytest.raises(ValueError, match="temperature: 1.0 → 0.5"):
        Study(c4).report_cells()
    os.remove(rs)

    # report, through the command
    assert launch_ga.main(["--config=configs/grad_angles_quickstart.py", f"--config.model.path={c.model.path}",
                           "--config.warm_start=", f"--out={c.grad_angles.out}", "--config.grad_angles.group_size=4",
                           "--config.grad_angles.authors_k=3", "--config.grad_angles.queries=2",
                           "--config.grad_angles.min_n=2", "--stage=report",
                           "--params=full", "--protocol=paper"]) == 0  # restricts the grads stage, not the report
    printed = capsys.readouterr().out
    assert "paper full/loglik: cross" in printed and "authors adapters/advantage" in printed
    rep = os.path.join(c.grad_angles.out, "report")
    summary = json.load(open(os.path.join(rep, "summary.json")))
    s = summary["paper"]["full/loglik"]
    assert s["queries"] == 2 and s["cross"]["n"] == 8 and s["same_reasoning"]["n"] == 12
    assert "control" not in s and "cross_vs_control" not in s  # a study without the control reports none
    assert summary["paper"]["full/advantage"]["cross"]["median"] == pytest.approx(s["cross"]["median"])
    with open(os.path.join(rep, "angles.csv")) as f:
        rows = list(csv.DictReader(f))
    flat = [r for r in rows if r["protocol"] == "paper" and r["params"] == "full" and r["weighting"] == "loglik"
            and r["tensor"] == "all" and r["layer"] == "all"]
    assert len(flat) == 2 * (4 + 6 + 6)
    x = [r for r in flat if r["query"] == "q0" and r["kind"] == "cross" and r["a"] == "0"]
    assert float(x[0]["angle"]) == pytest.approx(ga.pair_stats(reas[0], tool0).angle(), abs=1e-3)
    units = [r for r in rows if r["protocol"] == "authors" and r["layer"] not in ("all",)]
    assert units and {r["kind"] for r in units} == {"cross", "same"}
    for name in ("report.md", "paper_cross_vs_same.png", "authors_layers_full_advantage.png"):
        assert os.path.getsize(os.path.join(rep, name)) > 0, name
    text = open(os.path.join(rep, "report.md")).read()
    assert "| full/loglik |" in text
    walls = text.split("## Wall time")[1].split("Files:")[0]
    fp = [line for line in walls.splitlines() if line.startswith("- grads full/paper:")]
    assert len(fp) == 1 and fp[0].endswith("s a query)"), walls  # per-query time, not the stage time again
    assert (summary["setting"]["params"] == ["full", "adapters"]
            and summary["setting"]["protocols"] == ["paper", "authors"])


def test_the_control_study_matches_direct_random_splits(studied, tmp_path):
    """`control=True`: the paper protocol's Gram gains each trajectory's two random token sets (4G rows); the
    control angle from the Gram equals the angle of the same sets' gradients computed directly; the report
    tests cross against control; gradients computed without the control are computed again."""
    from dart_jax.experiments.grad_run import _stable
    c, first, (ids, pos, lm, acc) = studied
    c2 = c.copy_and_resolve_references()
    c2.grad_angles.update(out=str(tmp_path), params=["adapters"], protocols=["paper"])
    _write_chunk(tmp_path, ids, pos, lm, acc, ["q0", "q1"])
    plain = Study(c2)
    plain._policy = first.policy()
    assert plain.grads() == {"adapters/paper": 2}
    c2.grad_angles.control = True
    study = Study(c2)
    study._policy = first.policy()
    assert study.grads_mismatch("adapters", "paper") == ["control: None → True"]
    assert study.grads() == {"adapters/paper": 2}  # computed again, with the control
    z = np.load(os.path.join(study.grad_dir("adapters", "paper"), "q0.npz"))
    assert bool(z["control"]) and z["gram"].shape[1:] == (16, 16) and z["present"].all()
    assert np.array_equal(z["tokens"][8:12], z["tokens"][:4]) and np.array_equal(z["tokens"][12:], z["tokens"][4:8])
    rg, tree, base = study._role_grads("adapters", "loglik")
    w = int((pos[1] >= 0).sum())
    (g_a, _), (g_b, _) = rg.random_split(tree, base, ids[1:2, :w], pos[1:2, :w], lm[1:2, :w], np.ones(1),
                                         np.random.default_rng([0, _stable("q0"), 1]))
    tot = z["gram"].sum(0)
    np.testing.assert_allclose(ga.angle(tot[9, 13], tot[9, 9], tot[13, 13]), ga.pair_stats(g_a, g_b).angle(), atol=1e-3)
    summary = study.report()
    s = summary["paper"]["adapters/loglik"]
    assert s["control"]["n"] == 8 and s["cross_vs_control"]["queries"] == 2
    text = open(os.path.join(tmp_path, "report", "report.md")).read()
    assert "Role-agnostic control" in text and "cross − control" in text
    with open(os.path.join(tmp_path, "report", "trajectories.csv")) as f:
        traj = list(csv.DictReader(f))
    assert len(traj) == 8 and all(r["control_a_tokens"] == r["reasoning_tokens"] for r in traj)
    assert [float(r["accuracy"]) for r in traj[:4]] == acc.tolist()
    # switched off again: the 4G files are computed again as 2G, not mixed with new ones
    c2.grad_angles.control = False
    off = Study(c2)
    off._policy = first.policy()
    assert off.grads_mismatch("adapters", "paper") == ["control: True → None"]
    assert off.grads() == {"adapters/paper": 2}
    assert np.load(os.path.join(off.grad_dir("adapters", "paper"), "q0.npz"))["gram"].shape[1:] == (8, 8)


def test_routed_shares_read_only_the_role_columns_of_a_control_gram():
    """DART's per-adapter shares come from the 2G role columns; a control study's random-set columns (2G..4G)
    are not a role and must not enter them."""
    from dart_jax.analysis.grad_report import routed_shares
    names = np.asarray(["['reasoning']['a']", "['tool']['a']"])
    gram = np.zeros((2, 8, 8))
    for col, (on_r, on_t) in enumerate([(3, 1), (3, 1), (1, 1), (1, 1)] + [(100, 1)] * 4):
        gram[0, col, col], gram[1, col, col] = on_r, on_t
    rec = {"names": names, "gram": gram, "present": np.ones(8, bool), "advantages": np.zeros(2)}
    got = routed_shares([rec])
    assert got["reasoning"]["median"] == pytest.approx(0.75) and got["reasoning"]["n"] == 2
    assert got["tool"]["median"] == pytest.approx(0.5) and got["tool"]["n"] == 2


def test_the_sketch_agrees_with_the_exact_gram(studied, tmp_path):
    c, _, (ids, pos, lm, acc) = studied
    c2 = c.copy_and_resolve_references()
    c2.grad_angles.update(out=str(tmp_path), exact_max_gb=0.0, sketch_dim=16384, params=["full"], protocols=["paper"])
    studied[1].grads()  # the exact run (skipped when the test above made it)
    _write_chunk(tmp_path, ids, pos, lm, acc, ["q0"])
    study = Study(c2)
    study._policy = studied[1].policy()
    study.grads()
    z = np.load(os.path.join(study.grad_dir("full", "paper"), "q0.npz"))
    ze = np.load(os.path.join(studied[1].grad_dir("full", "paper"), "q0.npz"))
    assert not bool(z["exact"]) and bool(ze["exact"])
    n = z["gram"].shape[1]
    ts, te = z["gram"].sum(0), ze["gram"].sum(0)
    for i in range(n):
        for j in range(i + 1, n):
            assert ga.angle(ts[i, j], ts[i, i], ts[j, j]) == pytest.approx(ga.angle(te[i, j], te[i, i], te[j, j]),
                                                                           abs=2)


@pytest.mark.slow  # ~1 min alone on 2 cores: four 135M-parameter gradients and their sketches
def test_sketch_within_2_degrees_of_exact_on_smollm2_gradients(tmp_path):
    """The issue's bar for the sketch: on SmolLM2-135M's real per-role gradients (all 135M parameters,
    the shipped warm start, the hand-made group), 16,384 buckets per unit give flattened, per-layer and
    per-tensor angles within ±2° of exact ones."""
    c = grad_angles_quickstart.get_config()
    c.grad_angles.out = str(tmp_path)
    study = Study(c)
    pol = study.policy()
    ids, pos, lm, _ = _group(pol.tokenizer, 2)
    full = MethodSpec("full")
    grads = [_direct(study, full, pol.base, "loglik", ids[i:i + 1], pos[i:i + 1], lm[i:i + 1], np.ones(1), role)
             for i in range(2) for role in ("reasoning", "tool")]
    sketch = ga.Sketch(16384, 0)
    sk = [sketch(g) for g in grads]
    for i in range(4):
        for j in range(i + 1, 4):
            exact = ga.pair_stats(grads[i], grads[j])
            est = ga.sketch_stats(*sk[i][:2], sk[i][2], sk[j][2])
            assert est.angle() == pytest.approx(exact.angle(), abs=2)
            for agg in ("per_layer", "per_tensor"):
                e, s = getattr(exact, agg)(), getattr(est, agg)()
                worst = max(abs(e[k] - s[k]) for k in e)
                assert worst <= 2, (i, j, agg, worst)
