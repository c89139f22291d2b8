"""run.provenance: which code and machine wrote a run, recorded without ever stopping it."""

import json
import logging
import os
import subprocess

from dart_jax.run import provenance


def test_each_start_appends_a_line_with_code_versions_and_devices(tmp_path):
    first = provenance.record(str(tmp_path), 0, resumed=False)
    provenance.record(str(tmp_path), 8, resumed=True)
    lines = provenance.read(str(tmp_path))
    assert [(p["start_step"], p["resumed"]) for p in lines] == [(0, False), (8, True)]
    assert lines[0] == json.loads(json.dumps(first))
    assert lines[0]["versions"]["jax"] and lines[0]["versions"]["python"]
    assert lines[0]["machine"]["devices"] >= 1 and lines[0]["machine"]["backend"]
    repo = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    head = subprocess.run(["git", "-C", repo, "rev-parse", "HEAD"], capture_output=True, text=True)
    if head.returncode == 0:  # a checkout git can read: the commit is the checkout's
        assert lines[0]["commit"] == head.stdout.strip() and isinstance(lines[0]["dirty"], bool)


def test_not_a_checkout_records_no_commit(tmp_path, monkeypatch):
    monkeypatch.setattr(provenance, "_REPO", str(tmp_path))  # as installed in site-packages: no .git
    assert provenance.code() == {"commit": None, "dirty": None}


def test_a_failed_write_is_logged_not_raised(tmp_path, caplog):
    (tmp_path / "provenance.jsonl").mkdir()  # the file cannot be opened for appending
    with caplog.at_level(logging.WARNING, logger="dart_jax.run.provenance"):
        line = provenance.record(str(tmp_path), 3, resumed=True)
    assert line["start_step"] == 3 and "provenance not recorded" in caplog.text
