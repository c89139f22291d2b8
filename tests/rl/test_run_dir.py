"""A run's records are never destroyed by accident: a fresh run refuses a directory that holds a run
(unless --overwrite), --resume fails with the reason (a changed configuration named field by field,
or corrupt checkpoints) and truncates nothing, and a checkpoint save killed with SIGKILL at any
moment leaves the previous checkpoint restorable."""

import os
import signal
import subprocess
import sys
import time

import jax
import numpy as np
import pytest

from dart_jax.rl.trainer import Trainer
from dart_jax.run import provenance, run_dir
from dart_jax.run.checkpoint import Checkpointer
from dart_jax.run.metrics import read_metrics
from dart_jax.run.run_dir import RunDirError
from rl.test_trainer import _config
from xla_env import xla_flags


def _snapshot(d):
    return {name: open(os.path.join(d, name), "rb").read()
            for name in ("metrics.jsonl", "rollouts.jsonl", "run_config.json", "provenance.jsonl")}


def test_fresh_resume_and_overwrite_rules(tiny_smollm_dir, tmp_path):
    out = tmp_path / "run"
    c = _config(tiny_smollm_dir, out, steps=1)
    c.eval.n = 0
    Trainer(c).run()
    before = _snapshot(out)
    # 1. a fresh run into a directory holding a run is refused, and touches nothing
    with pytest.raises(RunDirError, match=r"already holds a run \(checkpoints at steps \[1\], metrics.jsonl"):
        Trainer(c).run()
    assert _snapshot(out) == before
    # 2. resume with a changed adapter rank and targets: the error names both fields, nothing is truncated
    changed = _config(tiny_smollm_dir, out, steps=2)
    changed.eval.n = 0
    changed.method.rank = 4
    changed.method.targets = ("q", "v")
    with pytest.raises(RunDirError) as err:
        Trainer(changed).run(resume=True)
    msg = str(err.value)
    assert "different configuration" in msg and "method.rank: 8 → 4" in msg
    assert 'method.targets: ["q", "k", "v", "o", "gate", "up", "down"] → ["q", "v"]' in msg
    assert "train.steps" not in msg  # a resume may extend the run
    assert _snapshot(out) == before
    # 3. the same configuration but a corrupt checkpoint: named as corrupt, nothing truncated
    ck = out / "checkpoints" / "1"
    victim = max((os.path.join(r, f) for r, _, fs in os.walk(ck) for f in fs), key=os.path.getsize)
    with open(victim, "r+b") as f:
        f.seek(os.path.getsize(victim) // 2)
        f.write(b"\xff\x00\xff")
    longer = _config(tiny_smollm_dir, out, steps=2)
    longer.eval.n = 0
    with pytest.raises(RunDirError, match=r"corrupt or unfinished with the same configuration: step 1: "
                                          r"CorruptCheckpoint: checkpoint 1: files missing or altered"):
        Trainer(longer).run(resume=True)
    assert _snapshot(out) == before
    # 4. --overwrite replaces the run
    res = Trainer(longer).run(overwrite=True)
    assert [r["step"] for r in read_metrics(res["metrics"])] == [1, 2]
    assert run_dir.saved_config(str(out))["train"]["steps"] == 2
    # the replaced run's provenance went with it: one line, this start's
    assert [(p["start_step"], p["resumed"]) for p in provenance.read(str(out))] == [(0, False)]




def test_resume_with_nothing_to_resume_says_so(tiny_smollm_dir, tmp_path):
    c = _config(tiny_smollm_dir, tmp_path / "empty", steps=1)
    with pytest.raises(RunDirError, match="no checkpoint in .*nothing to resume"):
        Trainer(c).run(resume=True)


def test_config_differences_are_field_by_field():
    saved = {"method": {"rank": 8, "targets": ["q"]}, "train": {"steps": 4}, "optim": {"lr": 1e-5}}
    now = {"method": {"rank": 8, "targets": ["q", "v"]}, "train": {"steps": 9}, "optim": {"lr": 2e-5}, "new": 1}
    assert run_dir.config_differences(saved, now) == ['method.targets: ["q"] → ["q", "v"]', 'new: "<absent>" → 1',
                                                      "optim.lr: 1e-05 → 2e-05"]
    # a field added to the code after the run was written: its default is what the run did
    later = {"method": {"rank": 8, "targets": ["q"], "agent_params": "full"}, "train": {"steps": 4},
             "optim": {"lr": 1e-5}}
    assert run_dir.config_differences(saved, later) == []
    later["method"]["agent_params"] = "lora"
    assert run_dir.config_differences(saved, later) == ['method.agent_params: "<absent>" → "lora"']


KILLER = r"""
import sys, numpy as np
from dart_jax.run.checkpoint import Checkpointer
ck = Checkpointer(sys.argv[1], keep=10)
for step in range(1, 1000):
    print("saving", step, flush=True)
    ck.save(step, {"w": np.full((2_000_000,), step, np.float32)}, {"step": step})
    print("saved", step, flush=True)
"""


@pytest.mark.parametrize("delay", [0.0, 0.01, 0.05])
def test_sigkill_during_a_checkpoint_save_falls_back(tmp_path, delay):
    """SIGKILL at `delay` s after a save began (orbax writing, the rename, or the manifest): the
    newest checkpoint that restores is a complete one and holds its own step's values."""
    d = str(tmp_path / "ck")
    root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    proc = subprocess.Popen([sys.executable, "-c", KILLER, d], cwd=root, stdout=subprocess.PIPE, text=True,
                            env=dict(os.environ, PYTHONPATH=root, JAX_PLATFORMS="cpu", XLA_FLAGS=xla_flags(1)))
    for line in proc.stdout:
        if line.startswith("saving") and int(line.split()[1]) == 3:
            time.sleep(delay)
            os.kill(proc.pid, signal.SIGKILL)
            break
    proc.wait(timeout=60)
    assert proc.returncode == -signal.SIGKILL
    got = Checkpointer(d, keep=10).restore_latest({"w": np.zeros((2_000_000,), np.float32)})
    assert got is not None
    step, tree, meta = got
    assert step >= 2 and meta["step"] == step
    np.testing.assert_array_equal(np.asarray(tree["w"]), np.full((2_000_000,), step, np.float32))


def test_resume_failure_names_a_layout_mismatch_apart_from_corruption(tmp_path):
    """A checkpoint of an older train-state layout (no run_config.json, a structure error) is named as
    such, not as corruption."""
    err = run_dir.resume_failure(str(tmp_path), {"train": {"steps": 2}},
                                 {3: "ValueError: checkpoint does not match the train state: missing ['a']"})
    assert "layout differs" in str(err) and "step 3: ValueError" in str(err) and "corrupt or unfinished" not in str(err)
    err = run_dir.resume_failure(str(tmp_path), {"train": {"steps": 2}}, {3: "CorruptCheckpoint: files altered"})
    assert "corrupt or unfinished (no run_config.json" in str(err)


def _flip(path):
    victim = max((os.path.join(r, f) for r, _, fs in os.walk(path) for f in fs), key=os.path.getsize)
    with open(victim, "r+b") as f:
        f.seek(os.path.getsize(victim) // 2)
        f.write(b"\xff\x00\xff\x00")


def test_a_corrupt_checkpoint_never_becomes_verified(tiny_smollm_dir, tmp_path):
    """Corrupt step 2, resume (falls back to 1), train through step 2 again, resume again: the final
    state equals an uninterrupted run's. Before, the second save of step 2 was skipped by orbax and
    a fresh manifest written over the corrupt files, so the next resume loaded them."""
    def cfg(out, steps):
        c = _config(tiny_smollm_dir, out, steps=steps)
        c.eval.n = 0
        return c

    ref = Trainer(cfg(tmp_path / "ref", 3))
    ref.run()
    out = tmp_path / "run"
    Trainer(cfg(out, 2)).run()
    _flip(out / "checkpoints" / "2")
    Trainer(cfg(out, 2)).run(resume=True)  # falls back to 1, moves 2 aside, trains step 2 again
    moved = os.listdir(out / "checkpoints" / "unusable")
    assert len(moved) == 1 and moved[0].startswith("2-")
    assert "files missing or altered" in open(out / "checkpoints" / "unusable" / moved[0] / "reason.txt").read()
    last = Trainer(cfg(out, 3))
    last.run(resume=True)
    # every checkpoint left in place verifies and loads (the re-trained step 2 included)
    ck = Checkpointer(str(out / "checkpoints"), keep=10)
    for step in ck.steps():
        ck.restore(step, last._train_tree())
    assert ck.restore_latest(last._train_tree())[0] == 3 and ck.failures == {}
    ck.close()
    for a, b in zip(jax.tree.leaves(ref.state.params), jax.tree.leaves(last.state.params)):
        np.testing.assert_array_equal(np.asarray(a), np.asarray(b))
    assert [r["step"] for r in read_metrics(str(out / "metrics.jsonl"))] == [1, 2, 3]


def test_saving_over_an_existing_step_is_an_error(tmp_path):
    ck = Checkpointer(str(tmp_path / "ck"), keep=3)
    ck.save(1, {"w": np.ones(3, np.float32)}, {})
    with pytest.raises(RuntimeError, match="checkpoint 1 was not written"):
        ck.save(1, {"w": np.zeros(3, np.float32)}, {})
    step, tree, _ = ck.restore_latest({"w": np.zeros(3, np.float32)})
    np.testing.assert_array_equal(np.asarray(tree["w"]), np.ones(3))
