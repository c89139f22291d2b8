"""provenance.jsonl is appended to at every (re)start: a last line cut short by a crash is set aside
(provenance.jsonl.torn, logged) before the next start's line, never glued to it, and the readers skip a
torn last line; a complete last line without its newline is kept and the next line starts after it."""

import json

from dart_jax.run import provenance
from dart_jax.run.records import append_record, mend_tail
from run.test_loop import _config, _train


def test_a_resume_after_a_torn_provenance_line_appends_a_line_of_its_own(tmp_path, caplog):
    cfg = _config(tmp_path / "run")
    _train(cfg, stop=3)[0].ckpt.close()
    path = tmp_path / "run" / "provenance.jsonl"
    with open(path, "a") as f:
        f.write('{"time": "2026-01-01T00:00:00+00:00", "start_st')  # a start that died mid-write
    assert [p["start_step"] for p in provenance.read(str(tmp_path / "run"))] == [0]  # the reader skips it
    _train(cfg, resume=True)[0].close("curve.png", ("loss",))
    assert [(p["start_step"], p["resumed"]) for p in provenance.read(str(tmp_path / "run"))] == [(0, False), (2, True)]
    assert (tmp_path / "run" / "provenance.jsonl.torn").read_text() == \
        '{"time": "2026-01-01T00:00:00+00:00", "start_st\n'
    assert all(json.loads(line) for line in path.read_text().splitlines())
    assert any("cut short" in r.getMessage() and "provenance.jsonl.torn" in r.getMessage() for r in caplog.records)


def test_a_complete_last_line_without_newline_is_kept(tmp_path):
    path = tmp_path / "p.jsonl"
    path.write_bytes(b'{"a": 1}\n{"a": 2}')
    append_record(str(path), {"a": 3})
    assert path.read_bytes() == b'{"a": 1}\n{"a": 2}\n{"a": 3}\n'
    assert not (tmp_path / "p.jsonl.torn").exists()
    # a single torn line with no newline anywhere in the file (read backwards past the start)
    one = tmp_path / "one.jsonl"
    one.write_bytes(b'{"a": ' + b"1" * 70000)
    mend_tail(str(one))
    assert one.read_bytes() == b"" and (tmp_path / "one.jsonl.torn").read_bytes() == b'{"a": ' + b"1" * 70000 + b"\n"
