"""Self-distillation reads a run's rollouts.jsonl as the run's other readers do: a last line cut short
by a crash mid-write (the run died while appending a step's trajectories) is skipped and logged, not a
JSONDecodeError; a damaged line followed by records is still a one-line error naming file and line."""

import json

import pytest

from dart_jax.run.records import DamagedRecords
from dart_jax.sft import demos as D
from sft.test_demos import _record

GOOD = [{"text": "<think> a </think>\n<answer> x </answer>", "loss": 1}]


def _rollouts(path, n):
    path.write_text("".join(json.dumps(_record(f"u{i}", GOOD)) + "\n" for i in range(n)))
    return path


def test_distill_skips_a_torn_last_line(tmp_path, caplog):
    path = _rollouts(tmp_path / "rollouts.jsonl", 3)
    fourth = json.dumps(_record("u3", GOOD, question="é" * 8), ensure_ascii=False).encode()
    with open(path, "ab") as f:  # a fourth record cut inside a multi-byte character: not even valid UTF-8
        f.write(fourth[:fourth.index("é".encode()) + 1])
    demos, stats = D.distill_demos(str(path))
    assert [d["id"] for d in demos] == ["u0", "u1", "u2"] and stats["rows"] == 3
    assert any("cut short" in r.getMessage() and "rollouts.jsonl" in r.getMessage() for r in caplog.records)


def test_distill_refuses_a_damaged_middle_line(tmp_path):
    path = _rollouts(tmp_path / "rollouts.jsonl", 2)
    path.write_bytes(b'{"step": 1, "uid"\n' + path.read_bytes())
    with pytest.raises(DamagedRecords, match=r"rollouts.jsonl: line 1 is not a JSON record and records follow"):
        D.distill_demos(str(path))
