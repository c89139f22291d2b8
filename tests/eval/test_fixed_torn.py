"""Fixed retrieval reads the recorded run's trajectory file (launch.evaluate's per_question.jsonl, a
training run's rollouts.jsonl, gzipped or not) as the run's other readers do: a last line cut short by
a crash mid-write is skipped and logged, not an 'invalid JSON' error."""

import gzip
import json

from dart_jax.eval.fixed import FixedRetrieval, recorded_observations
from dart_jax.rollout.protocol import QA


def _records(n):
    return [{"id": f"nq-{i}", "sample": 0, "question": f"q {i}",
             "tool_calls": [{"query": "x", "observation": f"Doc 1 {i}"}]} for i in range(n)]


def test_a_torn_last_line_is_skipped(tmp_path, caplog):
    text = "".join(json.dumps(r) + "\n" for r in _records(3))
    torn = json.dumps(_records(4)[3])[:25]
    plain = tmp_path / "per_question.jsonl"
    plain.write_text(text + torn)
    packed = tmp_path / "archived.jsonl.gz"
    with gzip.open(packed, "wt") as f:
        f.write(text + torn)
    for path in (plain, packed):
        by_uid, _ = recorded_observations(str(path), QA)
        assert by_uid == {f"nq-{i}": [f"Doc 1 {i}"] for i in range(3)}
    assert sum("cut short" in r.getMessage() for r in caplog.records) == 2
    tool = FixedRetrieval(str(plain), QA)
    assert tool(["x"], [{"uid": "nq-2", "question": "q 2"}]) == ["Doc 1 2"]
