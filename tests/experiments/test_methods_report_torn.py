"""The method comparison reads each evaluation's per_question.jsonl (or the archived .gz) as the run's
other readers do: a last line cut short by a crash mid-write is skipped and logged, so the report
counts the questions that were recorded whole."""

import gzip
import json

from dart_jax.experiments import methods_report


def test_a_torn_last_per_question_line_is_skipped(tmp_path, caplog):
    recs = [{"dataset": "nq", "id": i, "score": float(i % 2)} for i in range(5)]
    text = "".join(json.dumps(r) + "\n" for r in recs) + '{"dataset": "nq", "id": 5, "sco'
    (tmp_path / "live").mkdir()
    (tmp_path / "live" / "per_question.jsonl").write_text(text)
    (tmp_path / "archived").mkdir()
    with gzip.open(tmp_path / "archived" / "per_question.jsonl.gz", "wt") as f:
        f.write(text)
    for d in ("live", "archived"):
        assert methods_report._eval_counts(str(tmp_path / d), ["nq"]) == {"nq": (2, 5)}
    assert sum("cut short" in r.getMessage() for r in caplog.records) == 2
