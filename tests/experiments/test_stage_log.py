"""The staged-experiment dispatcher shared by the CEA, gradient and methods studies."""

import pytest

from dart_jax.experiments.stage_log import StageLog


class Toy(StageLog):
    STAGES = ("train", "eval", "report")
    STAGE_METHODS = {"eval": "evaluate"}
    STUDY = "toy"

    def __init__(self, out):
        self.out, self.calls = out, []

    def train(self):
        self.calls.append("train")
        return "trained"

    def evaluate(self):
        self.calls.append("eval")

    def report(self):
        self.calls.append("report")
        return {"summary": 1}


def test_stages_run_in_their_order_and_the_last_stage_gives_the_summary(tmp_path):
    t = Toy(str(tmp_path))
    assert t.run(("report", "train")) == {"summary": 1}
    assert t.calls == ["train", "report"]
    t = Toy(str(tmp_path))
    assert t.run(("train", "eval")) is None  # the summary stage did not run
    assert t.calls == ["train", "eval"]
    assert Toy(str(tmp_path)).run() == {"summary": 1}


def test_an_unknown_stage_is_named_before_anything_runs(tmp_path):
    t = Toy(str(tmp_path))
    with pytest.raises(ValueError, match=r"unknown toy stages \['sample'\]; expected some of"):
        t.run(("train", "sample"))
    assert t.calls == []


def test_stage_times_are_recorded_atomically(tmp_path):
    t = Toy(str(tmp_path))
    t._record("train", "reas", 12.34, steps=3)
    assert t.times()["train"]["reas"]["seconds"] == 12.3
    assert t.times()["train"]["reas"]["steps"] == 3
