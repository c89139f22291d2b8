"""Resumes survive torn records and refuse corrupt run files in one line (issue 49, classes 11 and 13):
a last line of metrics.jsonl / rollouts.jsonl cut short by a crash is set aside, a damaged
run_config.json is a one-line RunDirError, and a checkpoint whose integrity manifest does not list
every file of the step is unusable (the previous step is used)."""

import json
import os

import jax
import numpy as np
import pytest

from dart_jax.run.checkpoint import Checkpointer
from dart_jax.run.metrics import read_metrics
from dart_jax.run.records import DamagedRecords, read_rollouts
from dart_jax.run.run_dir import RunDirError
from run.test_loop import _config, _train


def _tear(path, keep_bytes=7):
    """Cut the file's last line short, `keep_bytes` into it (a crash mid-write)."""
    data = open(path, "rb").read()
    start = data.rstrip(b"\n").rfind(b"\n") + 1
    with open(path, "wb") as f:
        f.write(data[:start + keep_bytes])
    return data[start:start + keep_bytes]


@pytest.mark.parametrize("name", ["metrics.jsonl", "rollouts.jsonl"])
def test_a_torn_last_record_is_set_aside_and_resume_goes_on(tmp_path, name, caplog):
    cfg = _config(tmp_path / "run")
    loop, _, _ = _train(cfg, stop=3)  # checkpoint at 2; records for steps 1..3
    loop.ckpt.close()
    run = tmp_path / "run"
    if name == "rollouts.jsonl":  # a multi-byte character cut in half: not even valid UTF-8
        with open(run / name, "a", encoding="utf-8") as f:
            f.write(json.dumps({"step": 3, "question": "é" * 20}, ensure_ascii=False) + "\n")
        torn = _tear(run / name, keep_bytes=len('{"step": 3, "question": "') + 1)
    else:
        torn = _tear(run / name)
    # readers skip the torn tail
    rows = (read_metrics if name == "metrics.jsonl" else read_rollouts)(str(run / name))
    assert [r["step"] for r in rows] == ([1, 2, 3] if name == "rollouts.jsonl" else [1, 2])
    loop, state, _ = _train(cfg, resume=True)
    assert loop.start == 2 and int(state["n"]) == 5
    loop.close("curve.png", ("loss",))
    assert [r["step"] for r in read_metrics(str(run / "metrics.jsonl"))] == [1, 2, 3, 4, 5]
    assert [r["step"] for r in read_rollouts(str(run / "rollouts.jsonl"))] == [1, 2, 3, 4, 5]
    assert open(str(run / name) + ".torn", "rb").read() == torn + b"\n"
    assert any("cut short" in r.getMessage() and ".torn" in r.getMessage() for r in caplog.records)


def test_a_complete_last_record_without_its_newline_is_kept(tmp_path):
    cfg = _config(tmp_path / "run")
    _train(cfg, stop=3)[0].ckpt.close()
    path = tmp_path / "run" / "metrics.jsonl"
    path.write_bytes(path.read_bytes().rstrip(b"\n"))
    _train(cfg, resume=True)[0].close("curve.png", ("loss",))
    assert [r["step"] for r in read_metrics(str(path))] == [1, 2, 3, 4, 5]
    assert not os.path.exists(str(path) + ".torn")


def test_a_damaged_line_before_complete_records_is_a_one_line_error(tmp_path):
    path = tmp_path / "metrics.jsonl"
    path.write_bytes(b'{"step": 1}\n{"step": 2, "lo\n{"step": 3}\n')
    with pytest.raises(DamagedRecords, match=r"line 2 is not a JSON record and records follow") as e:
        read_metrics(str(path))
    assert "\n" not in str(e.value)


@pytest.mark.parametrize("content", [b'{"train": {"steps": 5}, "outp', b"\xff\xfe garbage", b"[1, 2]", b""])
def test_a_corrupt_run_config_is_a_one_line_error(tmp_path, content):
    cfg = _config(tmp_path / "run")
    _train(cfg, stop=3)[0].ckpt.close()
    (tmp_path / "run" / "run_config.json").write_bytes(content)
    with pytest.raises(RunDirError, match=r"run_config.json .*damaged.*move it aside") as e:
        _train(cfg, resume=True)
    assert "\n" not in str(e.value)
    assert sorted(os.listdir(tmp_path / "run" / "checkpoints")) == ["2", "integrity"]  # nothing moved aside


def _two_steps(d):
    ck = Checkpointer(str(d), keep=10)
    ck.save(1, {"w": np.ones(3, np.float32)}, {"step": 1})
    ck.save(2, {"w": np.full(3, 2.0, np.float32)}, {"step": 2})
    return ck


def _restore_latest(ck):
    got = ck.restore_latest({"w": np.zeros(3, np.float32)})
    return got[0], float(np.asarray(got[1]["w"])[0])


def test_every_file_of_a_step_must_be_in_its_manifest(tmp_path):
    ck = _two_steps(tmp_path / "ck")
    assert _restore_latest(ck) == (2, 2.0) and ck.failures == {}  # orbax adds no file after the manifest
    # an empty manifest verifies nothing: the step is unusable, the previous one is used
    with open(tmp_path / "ck" / "integrity" / "2.json", "w") as f:
        f.write("{}")
    assert _restore_latest(ck) == (1, 1.0)
    assert "lists no files" in ck.failures[2] and "\n" not in ck.failures[2]
    ck.close()


def test_a_partial_manifest_or_an_unlisted_file_makes_the_step_unusable(tmp_path):
    ck = _two_steps(tmp_path / "ck")
    manifest = tmp_path / "ck" / "integrity" / "2.json"
    listed = json.loads(manifest.read_text())
    # a manifest listing only some files; the unlisted one altered
    name = sorted(listed)[0]
    del listed[name]
    manifest.write_text(json.dumps(listed))
    with open(tmp_path / "ck" / "2" / name, "ab") as f:
        f.write(b"x")
    assert _restore_latest(ck) == (1, 1.0)
    assert "not in its integrity manifest" in ck.failures[2] and name in ck.failures[2]
    # an extra file beside a full manifest
    (tmp_path / "ck" / "1" / "extra.bin").write_bytes(b"x")
    assert ck.restore_latest({"w": np.zeros(3, np.float32)}) is None
    assert "extra.bin" in ck.failures[1] and all("\n" not in w for w in ck.failures.values())
    # a manifest that is not JSON
    manifest.write_text('{"a')
    with pytest.raises(Exception, match="not valid JSON"):
        ck.restore(2, {"w": np.zeros(3, np.float32)})
    ck.close()


def test_a_healthy_checkpoint_still_verifies_after_reopening(tmp_path):
    _two_steps(tmp_path / "ck").close()
    ck = Checkpointer(str(tmp_path / "ck"), keep=10)
    for step in (1, 2):
        ck.restore(step, {"w": np.zeros(3, np.float32)})
    assert _restore_latest(ck) == (2, 2.0)
    ck.close()
    assert jax.process_count() == 1


def test_a_gzip_archive_cut_short_reads_the_records_before_the_cut(tmp_path, caplog):
    """An archived records file (`.jsonl.gz`) whose stream was cut short: the records decompressed
    before the cut are read, the partial line after them is skipped, one warning."""
    import gzip

    from dart_jax.run.records import read_records
    data = b"".join(json.dumps({"i": i, "pad": "x" * 50}).encode() + b"\n" for i in range(2000))
    blob = gzip.compress(data)
    path = tmp_path / "per_question.jsonl.gz"
    path.write_bytes(blob[:len(blob) * 2 // 3])
    recs = read_records(str(path))
    assert 0 < len(recs) < 2000 and [r["i"] for r in recs] == list(range(len(recs)))
    assert any("cut short" in r.getMessage() for r in caplog.records)
