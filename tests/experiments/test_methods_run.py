"""launch.methods end to end on a tiny random Llama with SmolLM2's tokenizer (CI): two methods × one
seed, one GRPO step each, greedy evaluation of 2 questions per set, the report; the second call
skips what exists; the configs change only the method and the seed."""

import json

import pytest

from configs import methods_quickstart
from dart_jax.experiments.methods_report import clustered_paired, paired
from dart_jax.run.run_dir import config_dict
from launch import methods as launch_methods


def _args(model_dir, out, archive=""):
    return ["--config=configs/methods_quickstart.py", f"--config.model.path={model_dir}", "--config.warm_start=",
            f"--config.methods.out={out}", f"--config.methods.archive={archive}",  # "": no archive
            "--config.methods.methods=dart,2agent", "--config.methods.seeds=0",
            "--config.methods.limit=2", "--config.methods.batch=2", "--config.train.steps=1",
            "--config.train.prompts_per_step=2", "--config.train.group_size=2", "--config.train.mini_batch=4",
            "--config.train.micro_batch=2", "--config.output.checkpoint_every=1", "--config.rollout.max_turns=1",
            "--config.rollout.max_tokens_per_turn=8", "--config.rollout.max_obs_tokens=32",
            "--config.rollout.max_response_tokens=64", "--config.output.progress=False",
            "--config.output.tensorboard=False", "--config.mesh.shape=(1,1,1)"]


def test_runs_differ_only_in_method_and_seed():
    a = config_dict(methods_quickstart.get_config("dart,0"))
    for arg in ("lora16,0", "full,1", "mixlora,0", "2agent,1"):
        b = config_dict(methods_quickstart.get_config(arg))
        differ = {k for k in a if a[k] != b[k]}
        assert differ <= {"method", "optim", "train", "output", "rollout", "model"}, (arg, differ)
        # the model may differ only in what the backward pass recomputes (2-Agent's memory), not its math
        assert {k for k in a["model"] if a["model"][k] != b["model"][k]} <= {"remat_policy"}
        assert {k for k in a["train"] if a["train"][k] != b["train"][k]} <= {"seed"}
        assert {k for k in a["optim"] if a["optim"][k] != b["optim"][k]} <= {"lr"}
    assert methods_quickstart.get_config("full,1").rollout.invalid_action == "search_r1"
    with pytest.raises(ValueError, match="expected one of"):
        methods_quickstart.get_config("sft")


def test_lab_scales_every_method_rate_alike():
    from configs import lab_quickstart, methods_lab
    from dart_jax.experiments.methods_run import METHODS
    assert methods_lab.get_config("dart,0").optim.lr == pytest.approx(lab_quickstart.LR)
    for m in ("dart", "full", "2agent"):
        lab, nq = methods_lab.get_config(f"{m},0").optim.lr, methods_quickstart.get_config(f"{m},0").optim.lr
        assert nq == METHODS[m]["lr"] and lab == pytest.approx(nq * lab_quickstart.LR / METHODS["dart"]["lr"])


def test_the_second_lab_study_changes_only_what_decides_reward_variance():
    from configs import methods_lab, methods_lab_signal
    from tests.test_configs import _validate
    for arg in ("dart,0", "dart,2"):
        a, b = methods_lab.get_config(arg), methods_lab_signal.get_config(arg)
        _validate(b)
        assert a.train.prompts_per_step * a.train.group_size == b.train.prompts_per_step * b.train.group_size
        assert (b.train.group_size, b.sampling.temperature, b.loss.temperature) == (8, 0.7, 0.7)
        assert b.output.dir.startswith(methods_lab_signal.OUT) and b.train.seed == a.train.seed
        assert (b.optim.lr, b.train.steps, b.data.train, b.warm_start) == (a.optim.lr, a.train.steps, a.data.train,
                                                                          a.warm_start)


def test_the_third_lab_study_adds_only_the_kl_term():
    from configs import methods_lab_kl, methods_lab_signal
    from dart_jax.run.run_dir import config_differences
    from tests.test_configs import _validate
    for arg in ("dart,0", "dart,2"):
        a, b = methods_lab_signal.get_config(arg), methods_lab_kl.get_config(arg)
        _validate(b)
        assert (a.loss.kl_coef, b.loss.kl_coef, b.loss.kl_type) == (0.0, 0.001, "k3")
        assert b.output.dir.startswith(methods_lab_kl.OUT) and b.train.seed == a.train.seed
        diffs = [d.split(":")[0] for d in config_differences(config_dict(a), config_dict(b), ignore=())]
        assert diffs == ["loss.kl_coef", "methods.archive", "methods.out", "output.dir"], diffs


def test_the_fourth_lab_study_changes_only_the_rate():
    from configs import methods_lab_kl, methods_lab_lr
    from dart_jax.run.run_dir import config_differences
    from tests.test_configs import _validate
    for arg in ("dart,0", "dart,2"):
        a, b = methods_lab_kl.get_config(arg), methods_lab_lr.get_config(arg)
        _validate(b)
        assert (a.optim.lr, b.optim.lr) == (pytest.approx(1e-3), pytest.approx(2e-4))
        assert b.optim.lr == methods_lab_lr.LR
        assert b.output.dir.startswith(methods_lab_lr.OUT) and b.train.seed == a.train.seed
        diffs = [d.split(":")[0] for d in config_differences(config_dict(a), config_dict(b), ignore=())]
        assert diffs == ["methods.archive", "methods.lr_scale", "methods.out", "optim.lr", "output.dir"], diffs


def test_the_lab_method_comparison_is_the_fourth_study_with_lora16_and_full_beside_dart():
    """DART's runs are the fourth study's (same run config, read from its archive); LoRA-16, full, MixLoRA
    and 2-Agent-LoRA differ from them only in the method's own settings."""
    from configs import methods_lab_compare, methods_lab_lr
    from dart_jax.experiments.methods_run import METHODS, MethodsStages, run_name
    from dart_jax.run.run_dir import config_differences
    from tests.test_configs import _validate
    c = methods_lab_compare.get_config()
    methods = ("dart", "lora16", "full", "mixlora", "2agent_lora")
    assert c.methods.methods == ",".join(methods) and c.methods.archive == methods_lab_lr.ARCHIVE
    stages = MethodsStages(c)
    assert stages.runs == [(m, s) for m in methods for s in (0, 1, 2)]
    for s in (0, 1, 2):
        a, b = methods_lab_lr.get_config(f"dart,{s}"), methods_lab_compare.get_config(f"dart,{s}")
        _validate(b)
        diffs = [d.split(":")[0] for d in config_differences(config_dict(a), config_dict(b), ignore=())]
        assert diffs == ["methods.methods", "methods.out", "methods.report", "output.dir"], diffs
        assert stages.archived(run_name("dart", s), 8, 48), s  # the committed runs stand for DART here
        lora = methods_lab_compare.get_config(f"lora16,{s}")
        _validate(lora)
        assert (lora.method.variant, lora.method.rank, lora.optim.lr) == ("lora", 16, METHODS["lora16"]["lr"])
        diffs = {d.split(":")[0] for d in config_differences(config_dict(b), config_dict(lora), ignore=())}
        assert diffs <= {"method.variant", "method.rank", "method.alpha", "method.role_mask", "output.dir",
                         "output.export_adapters"}, diffs
        full = methods_lab_compare.get_config(f"full,{s}")
        _validate(full)
        assert (full.method.variant, full.optim.lr, full.rollout.invalid_action) == (
            "full", METHODS["full"]["lr"], "search_r1")
        diffs = {d.split(":")[0] for d in config_differences(config_dict(b), config_dict(full), ignore=())}
        assert diffs <= {"method.variant", "method.rank", "method.alpha", "method.role_mask", "output.dir",
                         "output.export_adapters", "optim.lr", "rollout.invalid_action"}, diffs
        # MixLoRA and 2-Agent-LoRA: the method's own settings, at DART's rate
        mix, two = methods_lab_compare.get_config(f"mixlora,{s}"), methods_lab_compare.get_config(f"2agent_lora,{s}")
        for other in (mix, two):
            _validate(other)
            assert other.optim.lr == b.optim.lr and other.train.seed == s
        assert (mix.method.variant, mix.method.experts, mix.method.top_k) == ("mixlora", 2, 2)
        assert (two.method.variant, two.method.agent_params, two.method.rank) == ("2agent", "lora", 8)
        # the engine serves one model: 2-Agent's evaluation runs the batch loop (the study's others: the engine)
        assert (b.rollout.engine, mix.rollout.engine, two.rollout.engine) == ("continuous", "continuous", "batch")
        for other, own in ((mix, {"method.experts", "method.top_k", "method.router_aux_coef"}),
                           (two, {"method.agent_params", "rollout.engine"})):
            diffs = {d.split(":")[0] for d in config_differences(config_dict(b), config_dict(other), ignore=())}
            assert diffs <= {"method.variant", "method.role_mask", "output.dir", "output.export_adapters"} | own, diffs


def test_grpo_signal_by_hand(tmp_path):
    """Groups are (step, uid); a group is mixed when its scores differ; rows left out of the update are not
    counted; the archive's gzipped records give the same counts."""
    import gzip

    from dart_jax.experiments.methods_report import signal
    recs = [(1, "a", 0.0), (1, "a", 1.0), (1, "b", 0.0), (1, "b", 0.0), (2, "a", 1.0), (2, "a", 1.0),
            (2, "c", 0.0), (2, "c", 0.5), (2, "c", 0.0)]
    lines = [json.dumps({"step": s, "uid": u, "score": x, "in_update": True}) for s, u, x in recs]
    lines.append(json.dumps({"step": 2, "uid": "d", "score": 1.0, "in_update": False}))
    (tmp_path / "run").mkdir()
    (tmp_path / "run" / "rollouts.jsonl").write_text("\n".join(lines) + "\n")
    want = {"trajectories": 9, "rewarded": 4, "groups": 4, "mixed": 2, "mixed_per_step": [1, 1]}
    assert signal(str(tmp_path / "run")) == want
    (tmp_path / "archived").mkdir()
    with gzip.open(tmp_path / "archived" / "rollouts.jsonl.gz", "wt") as f:
        f.write("\n".join(lines) + "\n")
    assert signal(str(tmp_path / "archived")) == want
    assert signal(str(tmp_path)) is None


def test_paired_mcnemar_by_hand():
    a = {("nq", str(i)): i < 7 for i in range(10)}          # right on 0..6
    b = {("nq", str(i)): i in (0, 7) for i in range(10)}     # right on 0 and 7
    q = paired(a, b, "nq")
    assert (q["only_a"], q["only_b"], q["both"], q["n"]) == (6, 1, 1, 10)
    assert q["p"] == pytest.approx(2 * (1 + 7) / 2 ** 7)      # two-sided binomial, 1 of 7 discordant
    assert paired(a, a, "nq")["p"] == 1.0 and paired(a, b, "hotpotqa")["n"] == 0


def test_a_trainings_logged_time_is_its_steps_and_checks(tmp_path):
    """The held-out checks' time beside the steps' (the last step's row holds both); no file, no figure."""
    from dart_jax.experiments.methods_run import logged_seconds
    rows = [{"step": 0, "time/eval_s": 30.0}, {"step": 1, "time/step_s": 100.0}, {"step": 2, "time/step_s": 80.0},
            {"step": 3, "time/step_s": 70.0, "time/eval_s": 20.0}]
    (tmp_path / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows) + "\n")
    assert logged_seconds(str(tmp_path)) == 30 + 100 + 80 + 70 + 20
    assert logged_seconds(str(tmp_path / "missing")) is None


def test_launch_methods_end_to_end(tiny_smollm_dir, tmp_path, capsys):
    out = tmp_path / "methods"
    assert launch_methods.main(_args(tiny_smollm_dir, out)) == 0
    summary = json.load(open(out / "report" / "summary.json"))
    assert set(summary["methods"]) == {"dart", "2agent"}
    for name in ("dart_s0", "2agent_s0"):
        r = summary["runs"][name]
        assert r["steps"] == 1 and all(n == 2 for _, n in r["counts"].values())
        assert r["train_state_mib"] > 0 and r["peak_rss_mib"] > 0
    # 2-Agent holds two full-parameter states, DART two small adapters
    assert summary["runs"]["2agent_s0"]["train_state_mib"] > 20 * summary["runs"]["dart_s0"]["train_state_mib"]
    assert (out / "report" / "reward_curves.png").is_file() and (out / "report" / "results.csv").is_file()
    assert "| dart_s0 |" in open(out / "report" / "report.md").read()
    # GRPO's signal: the report's counts from the rollout records equal the trainer's per-step metrics
    for name in ("dart_s0", "2agent_s0"):
        rows = [json.loads(s) for s in open(out / "train" / name / "metrics.jsonl")]
        sig = summary["runs"][name]["signal"]
        assert sig["mixed"] == sum(r["advantage/mixed_groups"] for r in rows if "advantage/groups" in r)
        assert sig["groups"] == sum(r["advantage/groups"] for r in rows if "advantage/groups" in r) == 2
    assert "## GRPO's signal" in open(out / "report" / "report.md").read()
    times = json.load(open(out / "stages.json"))
    assert (set(times["train"]) == {"dart_s0", "2agent_s0"}
            and set(times["eval"]) == {"warm_start", "dart_s0", "2agent_s0"})
    for name, t in times["train"].items():  # a training's time: its logged steps and checks
        rows = [json.loads(s) for s in open(out / "train" / name / "metrics.jsonl")]
        logged = sum(r.get("time/step_s", 0) + r.get("time/eval_s", 0) for r in rows)
        assert t["logged"] and t["seconds"] == pytest.approx(logged, abs=0.05)  # recorded to 0.1 s
    # the starting policy evaluated on the same questions; every run paired against it, and DART against 2-Agent
    assert all(n == 2 for _, n in summary["reference"]["counts"].values())
    pairs = {(q["a"], q["b"], q["dataset"]): q for q in summary["paired"]}
    assert {(a, b) for a, b, _ in pairs} == {("dart_s0", "warm_start"), ("2agent_s0", "warm_start"),
                                             ("dart_s0", "2agent_s0")}
    assert all(q["n"] == 2 and q["only_a"] + q["only_b"] + q["both"] <= 2 for q in pairs.values())
    report = open(out / "report" / "report.md").read()
    assert "| warm start (no GRPO) |" in report and "## Paired on the same questions" in report
    # the primary test's form: DART minus each method over seeds × questions, from the same outcomes
    (sq,) = [q for q in summary["seed_question"] if q["dataset"] == summary["datasets"][0]]
    q = pairs[("dart_s0", "2agent_s0", sq["dataset"])]
    assert (sq["a"], sq["b"], sq["seeds"], sq["questions"]) == ("dart", "2agent", 1, 2)
    assert sq["diff"] == pytest.approx((q["only_a"] - q["only_b"]) / q["n"]) and sq["lo"] <= sq["diff"] <= sq["hi"]
    assert "## DART against each method, over seeds and questions" in report
    # the wall-time table in the order the stages ran
    walls = [line.split(" | ")[1] for line in report.split("## Wall time")[1].splitlines()
             if line.startswith("| eval |")]
    assert walls == [k for k, _ in sorted(times["eval"].items(), key=lambda kv: kv[1]["finished"])]
    capsys.readouterr()
    # again: everything is skipped (the stage times are unchanged), the report rewritten
    assert launch_methods.main(_args(tiny_smollm_dir, out)) == 0
    again = json.load(open(out / "stages.json"))
    assert again["train"] == times["train"] and again["eval"] == times["eval"]
    assert "avg EM" in capsys.readouterr().out
    # a partial comparison: the report covers what was evaluated and names what is missing
    args = [a for a in _args(tiny_smollm_dir, out) if not a.startswith("--config.methods.methods=")]
    assert launch_methods.main(args + ["--config.methods.methods=dart,lora16,2agent", "--stage=report"]) == 0
    partial = json.load(open(out / "report" / "summary.json"))
    assert set(partial["methods"]) == {"dart", "2agent"} and partial["missing"] == ["lora16_s0"]
    assert "not yet trained and evaluated: lora16_s0" in open(out / "report" / "report.md").read()


def test_methods_archive_outlives_the_output_directory(tiny_smollm_dir, tmp_path):
    """Every finished evaluation is archived as it finishes; with `out` gone (a fresh clone), the archived
    runs are not trained again and the report from the archive equals the one from `out`."""
    import shutil
    out, archive = tmp_path / "methods", tmp_path / "archive"
    args = [a for a in _args(tiny_smollm_dir, out, archive) if not a.startswith("--config.methods.methods=")]
    args.append("--config.methods.methods=dart")
    assert launch_methods.main(args) == 0
    first = json.load(open(out / "report" / "summary.json"))
    assert (archive / "eval" / "dart_s0" / "per_question.jsonl.gz").is_file()
    assert (archive / "eval" / "warm_start" / "results.json").is_file()
    assert (archive / "train" / "dart_s0" / "metrics.jsonl").is_file()
    import gzip
    with gzip.open(archive / "train" / "dart_s0" / "rollouts.jsonl.gz", "rt") as f:
        scored = [json.loads(s) for s in f]
    assert len(scored) == 4 and all("pieces" not in r and "question" not in r and "score" in r for r in scored)
    prov = [json.loads(s) for s in open(archive / "train" / "dart_s0" / "provenance.jsonl")]
    assert [(p["start_step"], p["resumed"]) for p in prov] == [(0, False)] and prov[0]["versions"]["jax"]
    assert json.load(open(archive / "eval" / "dart_s0" / "config.json"))["optim"]["lr"] == 2e-4
    kept = json.load(open(archive / "stages.json"))
    assert set(kept["train"]) == {"dart_s0"} and set(kept["eval"]) == {"warm_start", "dart_s0"}
    # archiving again keeps an entry of the same evaluation as it is: its config.json records the settings
    # it ran with, not settings a later version added
    cfg_path = archive / "eval" / "dart_s0" / "config.json"
    as_run = json.load(open(cfg_path))
    as_run["output"]["progress"] = "as it ran"  # a field that is not a difference (run_dir.UNCHANGING)
    cfg_path.write_text(json.dumps(as_run))
    assert launch_methods.main(args + ["--stage=archive"]) == 0
    assert json.load(open(cfg_path)) == as_run
    shutil.rmtree(archive)                         # --stage=archive rebuilds it from what out holds
    assert launch_methods.main(args + ["--stage=archive"]) == 0
    assert json.load(open(archive / "stages.json")) == kept
    assert (archive / "eval" / "dart_s0" / "per_question.jsonl.gz").is_file()
    out_kept = tmp_path / "methods_kept"
    shutil.move(out, out_kept)
    assert launch_methods.main(args) == 0          # nothing to train or evaluate: the report from the archive
    assert not (out / "train").exists() and not (out / "eval").exists()
    again = json.load(open(out / "report" / "summary.json"))
    for k in ("runs", "methods", "reference", "paired", "missing"):
        assert again[k] == first[k], k
    times = json.load(open(out / "stages.json"))
    assert set(times) == {"report"}                # out's own record; the runs' times stay in the archive
    # the report written where the findings are committed (methods.report), from the archive alone
    elsewhere = tmp_path / "docs" / "report"
    assert launch_methods.main(args + ["--stage=report", f"--config.methods.report={elsewhere}"]) == 0
    assert json.load(open(elsewhere / "summary.json"))["paired"] == first["paired"]
    assert (elsewhere / "reward_curves.png").is_file() and (elsewhere / "report.md").is_file()
    # what the archive stands for: the same configuration of the run (methods section, output.dir and
    # resumable fields aside); another one is not taken for it, and a trial never overwrites the entry
    from dart_jax.experiments.methods_run import MethodsStages

    def stages(*extra):
        launch_methods.CLI.parse(args + list(extra))
        return MethodsStages(launch_methods.CLI.config.value)

    assert stages(f"--config.methods.out={tmp_path / 'elsewhere'}").archived("dart_s0", 1, 2)
    assert not stages("--config.train.prompts_per_step=4").archived("dart_s0", 1, 2)
    assert stages("--config.train.prompts_per_step=4").archived("warm_start", None, 2)  # the same starting policy
    assert not stages("--config.warm_start=data/warm_start/smollm2-135m-nq").archived("warm_start", None, 2)
    trial = stages("--config.methods.limit=1", f"--config.methods.out={tmp_path / 'trial'}")
    shutil.copytree(out_kept / "train" / "dart_s0", tmp_path / "trial" / "train" / "dart_s0")
    shutil.copytree(out_kept / "eval" / "dart_s0", tmp_path / "trial" / "eval" / "dart_s0")
    res = json.load(open(tmp_path / "trial" / "eval" / "dart_s0" / "results.json"))
    res["setup"]["limit"] = 1
    json.dump(res, open(tmp_path / "trial" / "eval" / "dart_s0" / "results.json", "w"))
    before = (archive / "eval" / "dart_s0" / "results.json").read_bytes()
    assert trial.archive() == {"dart_s0": "kept the archive's"}
    assert (archive / "eval" / "dart_s0" / "results.json").read_bytes() == before
    # a half-written archive (results.json is copied last) is not a finished run
    (archive / "eval" / "dart_s0" / "results.json").unlink()
    with pytest.raises(FileNotFoundError, match="has no finished checkpoint"):
        launch_methods.main(args + ["--stage=eval"])


def test_seed_question_bootstrap_by_hand():
    """Seed-averaged paired difference by hand; the interval resamples seeds (a seed's two runs together)
    and questions (the same for every seed): the same draws in plain loops give the same quantiles."""
    import numpy as np

    from dart_jax.experiments.methods_report import seed_question_bootstrap
    k = [("w", "1"), ("w", "2"), ("w", "3")]
    a = [{k[0]: True, k[1]: False, k[2]: True}, {k[0]: True, k[1]: True, k[2]: False}]
    b = [{k[0]: False, k[1]: False, k[2]: True}, {k[0]: True, k[1]: False, k[2]: True, ("x", "9"): True}]
    r = seed_question_bootstrap(a, b, "w", n_boot=2000, seed=3)
    assert r["diff"] == pytest.approx((1 / 3 + 0) / 2) and (r["seeds"], r["questions"]) == (2, 3)
    d = [[1, 0, 0], [0, 1, -1]]
    rng, vals = np.random.default_rng(3), []
    for _ in range(2000):
        si, qi = rng.integers(0, 2, 2), rng.integers(0, 3, 3)
        vals.append(sum(d[s][q] for s in si for q in qi) / 6)
    assert (r["lo"], r["hi"]) == pytest.approx(tuple(np.quantile(vals, [0.025, 0.975])))
    assert r["p_le0"] == pytest.approx(np.mean(np.array(vals) <= 0))
    # the seeds' differences (1/3, 0) with a t interval: mean ± t(0.975, 1) · sd / √2
    half = 12.706204736174707 * np.std([1 / 3, 0], ddof=1) / np.sqrt(2)
    assert r["per_seed"] == pytest.approx([1 / 3, 0]) and r["seed_t"] == pytest.approx([1 / 6 - half, 1 / 6 + half])
    same = seed_question_bootstrap(a, a, "w", n_boot=200)
    assert (same["diff"], same["lo"], same["hi"], same["p_le0"]) == (0.0, 0.0, 0.0, 1.0)
    ahead = seed_question_bootstrap([{q: True for q in k}] * 3, [{q: False for q in k}] * 3, "w", n_boot=200)
    assert (ahead["diff"], ahead["lo"], ahead["hi"], ahead["p_le0"]) == (1.0, 1.0, 1.0, 0.0)
    with pytest.raises(ValueError, match="pair them by seed"):
        seed_question_bootstrap(a, b[:1], "w")
    with pytest.raises(ValueError, match="no question of x"):
        seed_question_bootstrap(a, b, "x")


def test_clustered_paired_flips_whole_clusters_by_hand():
    """Four questions gained, none lost: McNemar (independent questions) 2 × 0.5^4 = 0.125. Grouped into
    clusters with net changes 1, 1, 2 (and one unmoved cluster), the sign flips of 3 clusters give
    sums ±1 ±1 ±2, of which |sum| ≥ 4 only all-plus and all-minus: p = 2/8."""
    a = {("sql", q): False for q in "abcde"}
    b = {("sql", q): q != "e" for q in "abcde"}
    cluster = {("sql", "a"): 0, ("sql", "b"): 1, ("sql", "c"): 2, ("sql", "d"): 2, ("sql", "e"): 3}
    assert paired(a, b, "sql")["p"] == 0.125
    got = clustered_paired(a, b, "sql", cluster)
    assert got == {"clusters": 4, "moved": 3, "net": 4, "p": 0.25}
    assert clustered_paired(a, a, "sql", cluster)["p"] == 1.0
    one = {k: v if k[1] in "cd" else False for k, v in b.items()}  # only cluster 2 moved: p 1 (McNemar 0.5)
    assert clustered_paired(a, one, "sql", cluster) == {"clusters": 4, "moved": 1, "net": 2, "p": 1.0}
