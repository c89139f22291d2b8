"""`launch.cea` end to end on a tiny random Llama with SmolLM2's real tokenizer, the real retriever
and real NQ questions (the quickstart setting): the three variants train one full-parameter GRPO
step each under their role masks, the six variants sample 2 questions × 2 answers (H_Tool / H_Reas
through the two-model composition), and the solve stage runs on what was sampled. A second run of
the same command skips every stage whose output exists."""

import json
import os
import shutil

import pytest

from configs import cea_quickstart
from dart_jax.analysis import cea
from dart_jax.experiments.cea_run import SOURCES, CEAStages, variant_config
from launch import cea as launch_cea


def _config(model_dir, out):
    c = cea_quickstart.get_config()
    c.model.path = model_dir
    c.warm_start = ""  # the shipped warm start belongs to SmolLM2, not to this tiny model
    c.train.steps = 1
    c.train.prompts_per_step = 2
    c.train.group_size = 2
    c.train.mini_batch = 4
    c.train.micro_batch = 2
    c.rollout.max_turns = 1
    c.rollout.max_tokens_per_turn = 8
    c.rollout.max_obs_tokens = 32
    c.rollout.max_response_tokens = 64
    c.loss.entropy_coef = 0.01  # random model: rewards are 0, the entropy term moves the weights
    c.optim.lr = 1e-3
    c.output.progress = False
    c.output.tensorboard = False
    c.output.checkpoint_every = 1
    c.cea.out = str(out)
    c.cea.limit = 2
    c.cea.n_samples = 2
    c.cea.batch = 4
    c.cea.n_boot = 200
    return c


def test_variant_configs_differ_only_in_role_mask_and_directory(tmp_path):
    c = _config("unused", tmp_path)
    got = {v: variant_config(c, v) for v in ("reas", "tool", "unified")}
    assert {v: g.method.role_mask for v, g in got.items()} == {"reas": "reasoning", "tool": "tool", "unified": "both"}
    assert {v: g.output.dir for v, g in got.items()} == {v: str(tmp_path / "train" / v) for v in got}
    strip = lambda g: {k: v for k, v in g.to_dict().items() if k not in ("method", "output")}  # noqa: E731
    assert strip(got["reas"]) == strip(got["tool"]) == strip(got["unified"]) == strip(c)
    assert c.method.role_mask == "both"  # the shared config is not modified
    assert set(SOURCES) == set(cea.VARIANTS)


class Crash(RuntimeError):
    pass


def test_launch_cea_end_to_end_and_resumable(tiny_smollm_dir, tmp_path, capsys):
    from dart_jax.rl.trainer import Trainer
    out = tmp_path / "cea"
    c = _config(tiny_smollm_dir, out)
    stages = CEAStages(c)
    # solving or sampling before their inputs exist names what is missing
    with pytest.raises(FileNotFoundError, match="have not been sampled.*run the sample stage first"):
        stages.solve()
    with pytest.raises(FileNotFoundError, match="run the train stage first"):
        stages.sample(("h_reas",))
    # M_Reas interrupted after its first step's records, before any checkpoint: the stage starts it afresh
    def crash(step, metrics):
        raise Crash

    with pytest.raises(Crash):
        Trainer(variant_config(c, "reas"), on_step=crash).run()
    assert (out / "train" / "reas" / "metrics.jsonl").is_file()
    assert stages.train() == {"reas": "trained", "tool": "trained", "unified": "trained"}
    for v in ("reas", "tool", "unified"):
        with open(out / "train" / v / "metrics.jsonl") as f:
            assert [json.loads(line)["step"] for line in f] == [1]
    assert stages.train() == {v: "skipped" for v in ("reas", "tool", "unified")}
    # a directory written by another configuration is refused, naming the field
    other = _config(tiny_smollm_dir, out)
    other.optim.lr = 5e-4
    with pytest.raises(ValueError, match="optim.lr"):
        CEAStages(other).train()

    assert stages.sample() == {v: stages.times()["sample"][v]["scores"] for v in cea.VARIANTS}
    for v in cea.VARIANTS:
        with open(out / "sample" / v / "per_question_accuracy.jsonl") as f:
            rows = [json.loads(line) for line in f]
        assert [r["n"] for r in rows] == [2, 2], v
        with open(out / "sample" / v / "results.json") as f:
            setup = json.load(f)["setup"]
        main, compose = SOURCES[v]
        assert setup["n_samples"] == 2 and setup["temperature"] == 1.0
        if compose:  # the other role's model: the trained run at its last step
            assert setup["composition"]["checkpoint"].endswith(os.path.join("train", compose[1]))
            assert setup["composition"]["step"] == 1 and setup["composition"]["variant"] == "full"
        if main:
            assert setup["variant"] == "full" and setup["step"] == 1
            assert setup["checkpoint"].endswith(os.path.join("train", main, "checkpoints"))
        else:
            assert setup["variant"] == "base"
        assert stages.sample_mismatch(v) == []
    ids = set()
    for v in cea.VARIANTS:
        with open(out / "sample" / v / "per_question_accuracy.jsonl") as f:
            ids.add(tuple(json.loads(line)["id"] for line in f))
    assert len(ids) == 1  # every variant answered the same questions
    # the random model answers nothing: the solve stage says so instead of inventing a β
    with pytest.raises(ValueError, match="all 2 questions were dropped"):
        stages.solve()
    times = stages.times()
    assert set(times) == {"train", "sample"} and set(times["sample"]) == set(cea.VARIANTS)

    # the command again: what exists is skipped; a sample taken differently is taken again
    with open(out / "sample" / "base" / "results.json") as f:
        results = json.load(f)
    results["setup"]["n_samples"] = 3
    with open(out / "sample" / "base" / "results.json", "w") as f:
        json.dump(results, f)
    assert stages.sample_mismatch("base") == ["n_samples: 3 → 2"]
    args = ["--config=configs/cea_quickstart.py", f"--config.model.path={tiny_smollm_dir}", "--config.warm_start=",
            f"--config.cea.out={out}", "--config.train.steps=1", "--config.cea.limit=2", "--config.cea.n_samples=2",
            "--config.cea.batch=4", "--config.output.checkpoint_every=1", "--config.train.prompts_per_step=2",
            "--config.train.group_size=2", "--config.train.mini_batch=4", "--config.train.micro_batch=2",
            "--config.rollout.max_turns=1", "--config.rollout.max_tokens_per_turn=8",
            "--config.rollout.max_obs_tokens=32", "--config.rollout.max_response_tokens=64",
            "--config.loss.entropy_coef=0.01", "--config.optim.lr=1e-3", "--config.output.progress=False",
            "--config.output.tensorboard=False", "--stage=sample"]
    assert launch_cea.main(args) == 0
    again = CEAStages(c).times()
    assert again["train"] == times["train"] and set(again["sample"]) == set(cea.VARIANTS)
    assert again["sample"]["base"] != times["sample"]["base"]  # base only was sampled again
    assert all(again["sample"][v] == times["sample"][v] for v in cea.VARIANTS if v != "base")
    assert CEAStages(c).sample_mismatch("base") == []
    assert "sample: " in capsys.readouterr().out

    # the solve stage through the command, on counts where questions are answered (a random model
    # answers none): β is written per question with its report
    for i, v in enumerate(cea.VARIANTS):
        path = out / "sample" / v / "per_question_accuracy.jsonl"
        rows = [json.loads(line) for line in open(path)]
        for j, r in enumerate(rows):
            r["correct"] = float((i + j) % 3)
            r["accuracy"] = r["correct"] / r["n"]
        path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    assert launch_cea.main(args[:-1] + ["--stage=solve", "--n-boot=50", "--boot-seed=3"]) == 0
    summary = json.load(open(out / "solve" / "summary.json"))
    assert summary["questions"] == 2 and summary["kept"] == 2 and summary["clip"]["_setup"]["seed"] == 3
    assert (out / "solve" / "report.md").is_file() and (out / "solve" / "beta.csv").is_file()
    assert "β23 mean" in capsys.readouterr().out
    # β23 alone from the four single-model variants (a study whose compositions were not sampled)
    assert launch_cea.main(args[:-1] + ["--stage=solve", "--interference-only", "--n-boot=50"]) == 0
    b23 = json.load(open(out / "solve_b23" / "summary.json"))
    assert (b23["coefficients"] == ["b23"]
            and b23["clip"]["b23"]["mean"] == pytest.approx(summary["clip"]["b23"]["mean"]))
    assert "solve_b23" in capsys.readouterr().out

    # more questions (cea.limit raised): the questions sampled are kept (eval.resume), the new one sampled
    before = [json.loads(line) for line in open(out / "sample" / "h_tool" / "per_question.jsonl")]
    more = _config(tiny_smollm_dir, out)
    more.cea.limit = 3
    assert CEAStages(more).sample_mismatch("h_tool") == ["limit: 2 → 3"]
    CEAStages(more).sample(("h_tool",))
    after = [json.loads(line) for line in open(out / "sample" / "h_tool" / "per_question.jsonl")]
    assert after[:4] == before and len(after) == 6 and after[4]["id"] not in {r["id"] for r in before}
    setup = json.load(open(out / "sample" / "h_tool" / "results.json"))["setup"]
    assert setup["limit"] == 3 and setup["resumed"] == {"nq_corpus_heldout": 4}
    assert CEAStages(more).sample_mismatch("h_tool") == []


def test_launch_cea_refuses_unclear_requests(tmp_path):
    with pytest.raises(SystemExit, match="needs --config"):
        launch_cea.main([])
    with pytest.raises(SystemExit, match="without --config"):
        launch_cea.main(["--config=configs/cea_quickstart.py", f"--inputs={tmp_path}", f"--out={tmp_path}"])
    with pytest.raises(ValueError, match="at least 2 samples"):
        launch_cea.main(["--config=configs/cea_quickstart.py", "--config.cea.n_samples=1", "--stage=solve"])


def _lab_config(model_dir, out):
    from configs import cea_lab
    c = cea_lab.get_config()
    c.model.path = model_dir
    c.warm_start = ""
    c.train.update(steps=1, prompts_per_step=2, group_size=2, mini_batch=4, micro_batch=2)
    c.rollout.update(max_turns=1, max_tokens_per_turn=8, max_obs_tokens=32, max_response_tokens=48)
    c.optim.total_steps = 1
    c.output.update(progress=False, tensorboard=False, checkpoint_every=1)
    c.cea.update(out=str(out), train_seeds="0,1", limit=2, n_samples=2, batch=2, n_boot=100)
    c.cea.adopt = {}  # every variant trained here (the study's M_Unified adopts the method comparison's runs)
    # a random model answers nothing: keep all; one question at a time until cea.limit = 2 are kept
    c.cea.screen.update(limit=1, max_limit=3, n_samples=2, lo=0.0, hi=1.0)
    return c


def test_the_lab_study_screens_trains_seeds_and_pools_them(tiny_smollm_dir, tmp_path, capsys):
    """configs/cea_lab.py's stages on a tiny model: the screen samples M_Base on lab world 1 with its own
    seed and keeps the questions in its accuracy band; each trained variant runs once per training seed;
    every variant but M_Base is sampled per seed on the kept questions (their digest recorded); the solve
    stage solves each seed and pools them (seeds × questions, decided signs, seed noise, the lab's cells,
    role skills)."""
    from configs import cea_lab
    from dart_jax.eval.datasets import ids_digest
    from dart_jax.experiments import cea_screen
    assert cea_lab.get_config("tool,2").output.dir == "runs/cea_lab/train/tool_s2"
    out = tmp_path / "cea_lab"
    c = _lab_config(tiny_smollm_dir, out)
    stages = CEAStages(c)
    with pytest.raises(FileNotFoundError, match="run the screen stage first"):
        stages.sample(())
    sel = stages.screen()  # the pool grew from 1 question to 2, where cea.limit = 2 were kept, and stopped
    assert sel["pool"] == {"lab_world1": 2} and len(sel["selected"]["lab_world1"]) == 2
    assert (sel["setup"]["limit"], sel["setup"]["max_limit"], sel["setup"]["want"]) == (1, 3, 2)
    screen = json.load(open(out / "screen" / "results.json"))["setup"]
    assert (screen["seed"], screen["n_samples"], screen["variant"], screen["limit"]) == (1, 2, "base", 2)
    assert screen["resumed"] == {"lab_world1": 2}  # the first question's samples were reused, not drawn again
    assert stages.screen() == sel  # done: not screened again (from the pool already screened: nothing dropped)
    assert json.load(open(out / "screen" / "results.json"))["setup"]["resumed"] == {"lab_world1": 4}
    assert cea_screen.pools(sel["setup"]) == [1, 2, 3] and cea_screen.pools(sel["setup"], 2) == [2, 3]
    # a rule that needs fewer questions, over a directory that holds more: the rule's own smallest pool
    shutil.copytree(out / "screen", tmp_path / "fewer" / "screen")
    fewer = _lab_config(tiny_smollm_dir, tmp_path / "fewer")
    fewer.cea.limit = 1
    one = CEAStages(fewer).screen()
    assert one["pool"] == {"lab_world1": 1} and one["selected"]["lab_world1"] == sel["selected"]["lab_world1"][:1]
    same_seed = _lab_config(tiny_smollm_dir, out)
    same_seed.cea.screen.seed = same_seed.cea.seed
    with pytest.raises(ValueError, match="give the screen its own seed"):
        CEAStages(same_seed).screen()
    same_seed.cea.screen.seed = same_seed.cea.seed + same_seed.cea.batch  # the same draws, batch by batch
    with pytest.raises(ValueError, match="not cea.seed plus a multiple of cea.batch"):
        CEAStages(same_seed).screen()
    stale = _lab_config(tiny_smollm_dir, out)
    stale.cea.screen.hi = 0.5
    with pytest.raises(ValueError, match="run the screen stage again"):
        cea_screen.read_selection(CEAStages(stale))

    assert stages.train() == {f"{v}_s{s}": "trained" for v in ("reas", "tool", "unified") for s in (0, 1)}
    from dart_jax.run.run_dir import saved_config
    for s in (0, 1):
        saved = saved_config(str(out / "train" / f"tool_s{s}"))
        assert saved["train"]["seed"] == s and saved["method"]["role_mask"] == "tool"
    keys = ["base"] + [f"{v}_s{s}" for v in cea.VARIANTS[1:] for s in (0, 1)]
    stages.sample(cea.SINGLE)
    assert not (out / "solve_b23").exists() and not (out / "sample" / "h_tool_s0").exists()
    for key in keys[:7]:  # the single-model samples answer some questions (a random model answers none)
        path = out / "sample" / key / "per_question_accuracy.jsonl"
        path.write_text("".join(json.dumps(dict(r, correct=1.0)) + "\n" for r in map(json.loads, open(path))))
    stages.sample()  # the single-model samples are done: β23 is solved before the compositions are sampled
    early = out / "solve_b23" / "summary.json"
    assert json.load(open(early))["seeds"] == [0, 1] and list(json.load(open(early))["coefficients"]) == ["b23"]
    assert os.path.getmtime(early) < os.path.getmtime(out / "sample" / "h_tool_s0" / "results.json")
    assert sorted(p.name for p in (out / "sample").iterdir()) == sorted(keys)
    kept = sel["selected"]["lab_world1"]
    for key in keys:
        setup = json.load(open(out / "sample" / key / "results.json"))["setup"]
        assert setup["selected"] == {"lab_world1": ids_digest(kept)}
        rows = [json.loads(line) for line in open(out / "sample" / key / "per_question_accuracy.jsonl")]
        assert [r["id"] for r in rows] == kept[:2] and all(r["n"] == 2 for r in rows)
    comp = json.load(open(out / "sample" / "h_tool_s1" / "results.json"))["setup"]["composition"]
    assert comp["checkpoint"].endswith(os.path.join("train", "tool_s1"))
    assert stages.sample_mismatch("reas", 1) == []

    # counts where questions are answered (a random model answers none), then the pooled solve
    for i, key in enumerate(keys):
        path = out / "sample" / key / "per_question_accuracy.jsonl"
        rows = [json.loads(line) for line in open(path)]
        for j, r in enumerate(rows):
            r["correct"] = float((i + j) % 3 > 0) + float(j == 0)
        path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    s = stages.solve()
    assert s["seeds"] == [0, 1] and s["estimator"] == "jeffreys" and s["kept"] == 2
    assert set(s["per_seed"]) == {0, 1} and all((out / "solve" / f"s{x}" / "report.md").is_file() for x in (0, 1))
    assert {c["cell"] for c in s["cells"]} <= {f"h{h}/{op}" for h in (2, 3) for op in
                                               ("none", "bool", "compare", "count", "diff", "sum")}
    assert sum(c["questions"] for c in s["cells"]) == 2
    assert set(s["role_skills"]) == set(keys) and "tool_skill" in s["role_skills"]["base"]["lab_world1"]
    report = (out / "solve" / "report.md").read_text()
    assert "## β23 per cell" in report and "## Role skills per variant" in report and "[seed 1](s1/report.md)" in report
    launch_cea._print(s, "jeffreys", str(out / "solve"))
    assert "over seeds × questions" in capsys.readouterr().out
    # β23 alone from the four single-model variants, pooled the same way (before the compositions are sampled)
    b23 = stages.solve(interference_only=True)
    assert list(b23["coefficients"]) == ["b23"] and b23["kept"] == s["kept"] == 2
    assert b23["coefficients"]["b23"]["mean"] == pytest.approx(s["coefficients"]["b23"]["mean"], abs=1e-12)
    assert b23["seed_means"]["b23"] == pytest.approx(s["seed_means"]["b23"], abs=1e-12)
    assert set(b23["role_skills"]) == {k for k in keys if not k.startswith("h_")}
    assert all((out / "solve_b23" / x / "report.md").is_file() for x in ("s0", "s1", "."))
    assert "β23 alone, from the four single-model variants" in (out / "solve_b23" / "report.md").read_text()


def test_a_variant_trained_by_another_study_is_adopted_after_its_configuration_is_checked(tiny_smollm_dir, tmp_path):
    """cea.adopt: a finished run of another study with the same run configuration (its own study section
    aside) is linked as the variant's training, not trained again; an unfinished one, or one of another
    configuration, is refused naming why. The lab's M_Unified is the method comparison's full run."""
    from ml_collections import ConfigDict

    from configs import cea_lab, methods_lab_compare
    from dart_jax.experiments.cea_run import _trainer_view, config_mismatch, variant_config
    from dart_jax.rl.trainer import Trainer
    from dart_jax.run.run_dir import RESUMABLE, config_dict, config_differences
    for s in (0, 1, 2):  # the committed study's claim: nothing the trainer reads differs
        full, unified = methods_lab_compare.get_config(f"full,{s}"), cea_lab.get_config(f"unified,{s}")
        assert cea_lab.get_config().cea.adopt.unified.format(seed=s) == full.output.dir
        assert config_differences(_trainer_view(config_dict(full)), _trainer_view(config_dict(unified)),
                                  ignore=RESUMABLE) == []

    c = _config(tiny_smollm_dir, tmp_path / "cea")
    other = variant_config(c, "unified")
    other.output.dir = str(tmp_path / "methods" / "train" / "full_s0")
    other.methods = ConfigDict({"methods": "full", "out": str(tmp_path / "methods")})  # another study's section
    del other["cea"]
    c.cea.adopt = {"unified": other.output.dir}
    stages = CEAStages(c)
    os.makedirs(other.output.dir)  # begun, not finished: not trained twice
    with pytest.raises(ValueError, match="holds step 0 of 1: finish that run first"):
        stages.train(("unified",))
    Trainer(other).run(overwrite=True)
    assert config_mismatch(other.output.dir, variant_config(c, "unified")) == []
    assert stages.train(("unified",)) == {"unified": "adopted"}
    link = tmp_path / "cea" / "train" / "unified"
    assert link.is_symlink() and os.readlink(link) == os.path.join("..", "..", "methods", "train", "full_s0")
    assert stages.times()["train"]["unified"]["adopted"] == other.output.dir
    assert stages.train(("unified",)) == {"unified": "skipped"}  # linked: done
    # another configuration is refused, naming the field
    link.unlink()
    c2 = _config(tiny_smollm_dir, tmp_path / "cea")
    c2.optim.lr = 5e-4
    c2.cea.adopt = {"unified": other.output.dir}
    with pytest.raises(ValueError, match="written by another configuration.*optim.lr"):
        CEAStages(c2).train(("unified",))
    # a source that does not exist: the variant is trained here
    c3 = _config(tiny_smollm_dir, tmp_path / "cea3")
    c3.cea.adopt = {"unified": str(tmp_path / "nowhere")}
    assert CEAStages(c3).train(("unified",)) == {"unified": "trained"}
    assert not (tmp_path / "cea3" / "train" / "unified").is_symlink()
