"""The run skeleton both trainers share (run.loop), on a two-array train state: no model."""

import json
import os

import jax
import jax.numpy as jnp
import ml_collections
import numpy as np
import pytest

from dart_jax.run import provenance
from dart_jax.run.loop import RunLoop
from dart_jax.run.metrics import read_metrics
from dart_jax.run.run_dir import RunDirError


def _config(out, steps=5):
    return ml_collections.ConfigDict({"train": {"steps": steps}, "output": {
        "dir": str(out), "keep": 3, "checkpoint_every": 2, "progress": False, "tensorboard": False}})


def _train(config, resume=False, overwrite=False, stop=None, allow_change=()):
    """A toy run: the state counts steps; rollouts.jsonl gets one line per step, as GRPO's."""
    state, key = {"w": jnp.zeros(3), "n": jnp.asarray(0)}, jax.random.PRNGKey(0)
    loop = RunLoop(config, config.train.steps, "toy", resume, overwrite, allow_change=allow_change)
    state, key, meta = loop.restore(state, key)
    loop.begin()
    for step in loop.steps():
        if step == stop:
            break
        state = {"w": state["w"] + 1.0, "n": state["n"] + 1}
        with open(os.path.join(config.output.dir, "rollouts.jsonl"), "a") as f:
            f.write(json.dumps({"step": step + 1}) + "\n")
        loop.write(step + 1, {"loss": float(step)}, s="1")
        loop.checkpoint(step + 1, state, key, {"data_position": step + 1})
    return loop, state, meta


def test_fresh_checkpoint_every_n_and_the_last_then_resume(tmp_path):
    cfg = _config(tmp_path / "run")
    loop, _, _ = _train(cfg, stop=3)  # interrupted after step 3: checkpoint at 2 only
    loop.ckpt.close()
    assert loop.ckpt.steps() == [2]
    loop, state, meta = _train(cfg, resume=True)
    assert loop.start == 2 and meta == {"data_position": 2, "step": 2}
    assert int(state["n"]) == 5 and np.allclose(state["w"], 5.0)
    out = loop.close("curve.png", ("loss",))
    assert loop.ckpt.steps() == [2, 4, 5] and out["checkpoints"] == loop.ckpt.directory
    # records past the restored step were dropped before the resumed steps wrote theirs
    assert [r["step"] for r in read_metrics(out["metrics"])] == [1, 2, 3, 4, 5]
    with open(tmp_path / "run" / "rollouts.jsonl") as f:
        assert [json.loads(s)["step"] for s in f] == [1, 2, 3, 4, 5]
    assert [(p["start_step"], p["resumed"]) for p in provenance.read(str(tmp_path / "run"))] == [(0, False), (2, True)]
    assert os.path.isfile(out["plot"])


def test_a_fresh_run_refuses_a_run_dir_and_resume_needs_a_checkpoint(tmp_path):
    cfg = _config(tmp_path / "run", steps=1)
    _train(cfg)[0].close("curve.png", ("loss",))
    with pytest.raises(RunDirError, match="already holds a run"):
        RunLoop(cfg, 1, "toy")
    RunLoop(cfg, 1, "toy", overwrite=True).ckpt.close()
    loop = RunLoop(_config(tmp_path / "empty"), 1, "toy", resume=True)
    with pytest.raises(RunDirError, match="nothing to resume"):
        loop.restore({"w": jnp.zeros(3)}, jax.random.PRNGKey(0))
