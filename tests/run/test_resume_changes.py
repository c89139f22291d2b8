"""A resume runs the settings that wrote the run (run.run_dir.check_resume, through run.loop.RunLoop,
which both trainers use): a changed seed or learning rate is refused in one line naming old → new
unless --allow-change names it (then recorded in provenance.jsonl); how far the run goes, where it
lives (a moved or copied run directory), its cadences and its layout may change freely; an
--allow-change name that is no setting is a one-line error. On the toy train state of test_loop."""

import json
import os
import shutil

import pytest

from dart_jax.errors import UserError
from dart_jax.run import provenance
from dart_jax.run.loop import RunLoop
from dart_jax.run.metrics import read_metrics
from dart_jax.run.run_dir import ChangedSettings, RunDirError
from run.test_loop import _config, _train


def _run_config(out, steps=5, seed=0, lr=1e-5):
    c = _config(out, steps)
    c.train.seed = seed
    c.optim = {"lr": lr, "schedule": "constant"}
    c.mesh = {"shape": (8, 1, 1)}
    c.rollout = {"chunk_rows": 0}
    c.init_from = str(out / "adapters")  # a path inside the run directory
    return c


def _interrupted(tmp_path):
    cfg = _run_config(tmp_path / "run")
    loop, _, _ = _train(cfg, stop=3)  # checkpoint at step 2, records for steps 1..3
    loop.ckpt.close()
    return cfg


def _snapshot(d):
    return {name: open(os.path.join(d, name), "rb").read() for name in sorted(os.listdir(d))
            if os.path.isfile(os.path.join(d, name))}, sorted(os.listdir(os.path.join(d, "checkpoints")))


def test_a_changed_seed_and_learning_rate_are_refused_naming_old_and_new(tmp_path):
    _interrupted(tmp_path)
    before = _snapshot(tmp_path / "run")
    changed = _run_config(tmp_path / "run", seed=1, lr=2e-5)
    with pytest.raises(ChangedSettings) as e:
        _train(changed, resume=True)
    msg = str(e.value)
    assert "optim.lr: 1e-05 → 2e-05; train.seed: 0 → 1" in msg and "--allow-change=optim.lr,train.seed" in msg
    assert "\n" not in msg and isinstance(e.value, UserError) and isinstance(e.value, RunDirError)
    assert _snapshot(tmp_path / "run") == before  # refused before anything was moved, trimmed or appended
    # allowing one of the two still refuses the other, and names only it
    with pytest.raises(ChangedSettings, match=r"this run changes: train.seed: 0 → 1\. ") as e:
        _train(changed, resume=True, allow_change=("optim.lr",))
    assert "optim.lr" not in str(e.value)


def test_an_allowed_change_goes_ahead_and_is_recorded_in_provenance(tmp_path, caplog):
    _interrupted(tmp_path)
    changed = _run_config(tmp_path / "run", seed=1, lr=2e-5)
    loop, state, _ = _train(changed, resume=True, allow_change="train.seed,optim")  # a whole section too
    loop.close("curve.png", ("loss",))
    assert loop.start == 2 and int(state["n"]) == 5
    last = provenance.read(str(tmp_path / "run"))[-1]
    assert last["start_step"] == 2 and last["resumed"] and last["time"]
    assert last["changes"] == [{"key": "optim.lr", "old": 1e-5, "new": 2e-5, "by": "--allow-change"},
                               {"key": "train.seed", "old": 0, "new": 1, "by": "--allow-change"}]
    assert any("--allow-change" in r.getMessage() and "train.seed: 0 → 1" in r.getMessage() for r in caplog.records)
    # the allowed values are the run's settings from then on: going back is a change again, staying is none
    further = _run_config(tmp_path / "run", steps=7, seed=1, lr=2e-5)
    loop, state, _ = _train(further, resume=True)
    loop.close("curve.png", ("loss",))
    assert loop.start == 5 and int(state["n"]) == 7
    assert [c["key"] for c in provenance.read(str(tmp_path / "run"))[-1]["changes"]] == ["train.steps"]
    back = _run_config(tmp_path / "run", steps=8, seed=0, lr=1e-5)
    with pytest.raises(ChangedSettings, match=r"optim.lr: 2e-05 → 1e-05; train.seed: 1 → 0"):
        _train(back, resume=True)


def test_length_cadence_and_layout_need_no_allowance(tmp_path):
    _interrupted(tmp_path)
    longer = _run_config(tmp_path / "run", steps=6)
    longer.output.checkpoint_every = 3
    longer.mesh.shape = (2, 1, 4)
    longer.rollout.chunk_rows = 4
    loop, state, _ = _train(longer, resume=True)
    loop.close("curve.png", ("loss",))
    assert int(state["n"]) == 6
    by = {c["key"]: c["by"] for c in provenance.read(str(tmp_path / "run"))[-1]["changes"]}
    assert by == {"train.steps": "unchanging", "output.checkpoint_every": "unchanging", "mesh.shape": "layout",
                  "rollout.chunk_rows": "layout"}


@pytest.mark.parametrize("schedule, total, refused", [("cosine", 0, True), ("cosine", 100, False),
                                                      ("constant", 0, False)])
def test_more_sft_epochs_need_an_allowance_when_the_lr_schedule_spans_them(tmp_path, schedule, total, refused):
    """sft.epochs is how far a warm start goes, except when the lr schedule spans the SFT length
    (optim.total_steps=0, not constant): then every remaining step's learning rate changes with it."""
    from dart_jax.run.run_dir import check_resume, write_config
    c = _run_config(tmp_path / "run")
    c.optim = {"lr": 1e-5, "schedule": schedule, "total_steps": total}
    c.sft = {"epochs": 3}
    write_config(str(tmp_path / "run"), c)
    more = _run_config(tmp_path / "run")
    more.optim, more.sft = dict(c.optim), {"epochs": 4}
    if refused:
        with pytest.raises(ChangedSettings, match=r"sft.epochs: 3 → 4.*--allow-change=sft.epochs"):
            check_resume(str(tmp_path / "run"), more)
        assert check_resume(str(tmp_path / "run"), more, "sft.epochs")[0]["by"] == "--allow-change"
    else:
        assert check_resume(str(tmp_path / "run"), more) == [{"key": "sft.epochs", "old": 3, "new": 4,
                                                               "by": "unchanging"}]


@pytest.mark.parametrize("how", ["move", "copy"])
def test_a_moved_or_copied_run_directory_resumes_as_the_same_run(tmp_path, how):
    _interrupted(tmp_path)
    there = tmp_path / "elsewhere" / "run2"
    os.makedirs(there.parent)
    (shutil.move if how == "move" else shutil.copytree)(str(tmp_path / "run"), str(there))
    loop, state, _ = _train(_run_config(there), resume=True)  # output.dir and init_from (inside it) moved
    loop.close("curve.png", ("loss",))
    assert loop.start == 2 and int(state["n"]) == 5
    assert [r["step"] for r in read_metrics(str(there / "metrics.jsonl"))] == [1, 2, 3, 4, 5]
    changes = provenance.read(str(there))[-1]["changes"]
    assert [c["key"] for c in changes] == ["output.dir"]  # init_from compared relative to the run directory
    # a path that points outside the run directory is a change
    outside = _run_config(there)
    outside.init_from = str(tmp_path / "run" / "adapters")
    with pytest.raises(ChangedSettings, match=r'init_from: "<output.dir>/adapters" → ".*/run/adapters"'):
        _train(outside, resume=True)


def test_an_unknown_allow_change_key_is_a_clear_error(tmp_path):
    cfg = _interrupted(tmp_path)
    with pytest.raises(UserError, match=r"^--allow-change=optim.lrr: no setting optim.lrr; did you mean optim.lr\?$"):
        RunLoop(cfg, 5, "toy", resume=True, allow_change="optim.lrr")
    with pytest.raises(UserError, match=r"--allow-change=nonsense: no setting nonsense; name settings as"):
        RunLoop(cfg, 5, "toy", resume=True, allow_change=["nonsense"])
    with pytest.raises(UserError, match=r"give it with --resume"):
        RunLoop(_run_config(tmp_path / "fresh"), 5, "toy", allow_change="optim.lr")


def test_launch_commands_check_allow_change_before_anything_loads(tmp_path, capsys):
    from launch import sft, train
    base = ["--config=configs/quickstart.py", f"--config.output.dir={tmp_path / 'run'}", "--skip-preflight"]
    for argv, want in (([*base, "--resume", "--allow-change=optim.lrr"],
                        "launch.train: --allow-change=optim.lrr: no setting optim.lrr; did you mean optim.lr?"),
                       ([*base, "--allow-change=optim.lr"], "launch.train: --allow-change=optim.lr accepts changed "
                                                            "settings of a resumed run: add --resume")):
        with pytest.raises(SystemExit) as e:
            train.CLI.run(train.main, argv)
        assert e.value.code == 2
        err = capsys.readouterr().err.strip().splitlines()
        assert len(err) == 1 and err[0].startswith(want), err
    assert not os.path.exists(tmp_path / "run")  # nothing written
    # a changed seed of a resumed run: one line before any model loads (no model at this path)
    from configs import quickstart
    from dart_jax.run import run_dir
    c = quickstart.get_config()
    c.output.dir = str(tmp_path / "run")
    run_dir.write_config(c.output.dir, c)
    with pytest.raises(SystemExit) as e:
        train.CLI.run(train.main, [*base, "--resume", f"--config.train.seed={c.train.seed + 5}",
                                   "--config.model.path=/nonexistent", "--config.train.steps=999"])
    err = capsys.readouterr().err.strip().splitlines()
    assert e.value.code == 2 and len(err) == 1, err
    assert f"this run changes: model.path: {json.dumps(quickstart.get_config().model.path)} → \"/nonexistent\"; " \
           f"train.seed: {c.train.seed} → {c.train.seed + 5}. " in err[0] and "train.steps" not in err[0]
    with pytest.raises(SystemExit) as e:
        sft.CLI.run(sft.main, ["--config=configs/sft_quickstart.py", "--resume", "--allow-change=sft.seedd"])
    assert e.value.code == 2 and "did you mean sft.seed?" in capsys.readouterr().err
    for cmd in (train, sft):
        with pytest.raises(SystemExit):
            cmd.CLI.parse(["--help"])
        assert "--allow-change" in capsys.readouterr().out


def test_the_exempt_settings_are_listed_once_with_why(tmp_path):
    from dart_jax.rollout.agent import LAYOUT_ONLY
    from dart_jax.run import run_dir
    assert {f"rollout.{k}" for k in LAYOUT_ONLY} <= set(run_dir.LAYOUT) and "mesh.shape" in run_dir.LAYOUT
    assert not set(run_dir.UNCHANGING) & set(run_dir.LAYOUT)
    assert all(why.strip() for why in {**run_dir.UNCHANGING, **run_dir.LAYOUT}.values())
    for key in ("train.seed", "optim.lr", "sft.seed", "method.rank", "model.attention_impl", "eval.n"):
        assert key not in run_dir.RESUMABLE
    # a study's own section is read by the study's code (which compares it), never by the trainers
    run_dir.write_config(str(tmp_path), {"train": {"steps": 4}, "output": {"dir": "r"}, "methods": {"seeds": [1]}})
    assert run_dir.check_resume(str(tmp_path), {"train": {"steps": 4}, "output": {"dir": "r"},
                                                "methods": {"seeds": [1, 2]}}) == []
    with open(os.path.join(tmp_path, "run_config.json")) as f:
        assert json.load(f)["methods"] == {"seeds": [1]}
