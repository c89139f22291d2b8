"""`launch.cea` end to end on a tiny random Llama with SmolLM2's real tokenizer, the real retriever
and real NQ questions (the quickstart setting): the three variants train one full-parameter GRPO
step each under their role masks, the six variants sample 2 questions × 2 answers (H_Tool / H_Reas
through the two-model composition), and the solve stage runs on what was sampled. A second run of
the same command skips every stage whose output exists."""

import json
import os

import pytest

from configs import cea_quickstart
from dart_jax.analysis import cea
from dart_jax.analysis.cea_run import SOURCES, Stages, variant_config
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


def test_launch_cea_end_to_end_and_resumable(tiny_smollm_dir, tmp_path, capsys):
    out = tmp_path / "cea"
    c = _config(tiny_smollm_dir, out)
    stages = Stages(c)
    # solving before anything was sampled names what is missing
    with pytest.raises(FileNotFoundError, match="have not been sampled.*run the sample stage first"):
        stages.solve()
    with pytest.raises(FileNotFoundError, match="run the train stage first"):
        stages.sample(("reas",))
    assert stages.train() == {"reas": "trained", "tool": "trained", "unified": "trained"}
    for v in ("reas", "tool", "unified"):
        with open(out / "train" / v / "metrics.jsonl") as f:
            assert [json.loads(line)["step"] for line in f] == [1]
    assert stages.sample() == {v: stages.times()["sample"][v]["scores"] for v in cea.VARIANTS}
    for v in cea.VARIANTS:
        with open(out / "sample" / v / "per_question_accuracy.jsonl") as f:
            rows = [json.loads(line) for line in f]
        assert [r["n"] for r in rows] == [2, 2], v
        with open(out / "sample" / v / "results.json") as f:
            setup = json.load(f)["setup"]
        main, compose = SOURCES[v]
        assert setup["n_samples"] == 2 and setup["temperature"] == 1.0
        if compose:
            assert setup["composition"]["role"] == compose[0]
            assert setup["composition"]["checkpoint"].endswith(os.path.join("train", compose[1]))
        if main:
            assert setup["variant"] == "full" and setup["checkpoint"].endswith(os.path.join("train", main, "checkpoints"))
        else:
            assert setup["variant"] == "base"
    # all sampled from the same ids
    ids = set()
    for v in cea.VARIANTS:
        with open(out / "sample" / v / "per_question_accuracy.jsonl") as f:
            ids.add(tuple(json.loads(line)["id"] for line in f))
    assert len(ids) == 1
    # the random model answers nothing: the solve stage says so instead of inventing a β
    with pytest.raises(ValueError, match="all 2 questions were dropped"):
        stages.solve()
    times = stages.times()
    assert set(times) == {"train", "sample"} and set(times["sample"]) == set(cea.VARIANTS)
    # the command again: train and sample are skipped (their outputs exist); solve re-raises
    args = ["--config=configs/cea_quickstart.py", f"--config.model.path={tiny_smollm_dir}", "--config.warm_start=",
            f"--config.cea.out={out}", "--config.train.steps=1", "--config.cea.limit=2", "--config.cea.n_samples=2",
            "--stage=sample"]
    assert launch_cea.main(args) == 0
    assert Stages(c).times() == times
    assert "sample: " in capsys.readouterr().out
