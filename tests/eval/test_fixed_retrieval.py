"""Fixed retrieval: recorded observations from both trajectory formats, replayed call by call."""

import json

import pytest

from dart_jax.eval.fixed import FixedRetrieval, recorded_observations
from dart_jax.rollout.protocol import QA, SQL


def _write(path, recs):
    with open(path, "w") as f:
        for r in recs:
            f.write(json.dumps(r) + "\n")
    return str(path)


def test_reads_evaluation_records_and_training_rollouts(tmp_path):
    ev = _write(tmp_path / "per_question.jsonl", [
        {"id": "nq-1", "sample": 2, "question": "Who wrote Hamlet?",
         "tool_calls": [{"query": "w", "observation": "later sample"}]},
        {"id": "nq-1", "sample": 0, "question": "Who wrote Hamlet?",
         "tool_calls": [{"query": "hamlet", "observation": "Doc 1 A"}, {"query": "x", "observation": "Doc 1 B"}]},
        {"id": "nq-1", "sample": 1, "question": "Who wrote Hamlet?",
         "tool_calls": [{"query": "y", "observation": "Z"}]},
        {"id": "nq-2", "sample": 0, "question": "Capital of France", "tool_calls": []}])
    by_uid, by_q = recorded_observations(ev, QA)
    assert by_uid == {"nq-1": ["Doc 1 A", "Doc 1 B"], "nq-2": []}  # sample 0 is kept, wherever it stands
    assert by_q[("", "who wrote hamlet")] == ["Doc 1 A", "Doc 1 B"]
    roll = _write(tmp_path / "rollouts.jsonl", [
        {"step": 1, "uid": "nq-oracle-3", "question": "who sings x", "pieces": [
            {"text": "<think>a</think>\n<search> x </search>", "loss": 1},
            {"text": "\n\n<information>Doc 1(Title: X) text</information>\n\n", "loss": 0},
            {"text": "<answer> y </answer>", "loss": 1}]}])
    assert recorded_observations(roll, QA)[0] == {"nq-oracle-3": ["Doc 1(Title: X) text"]}
    with pytest.raises(ValueError, match="neither 'tool_calls'"):
        recorded_observations(_write(tmp_path / "bad.jsonl", [{"id": 1, "question": "q"}]), QA)
    with pytest.raises(ValueError, match="QA"):
        FixedRetrieval(ev, SQL)


def test_replays_call_by_call_and_counts(tmp_path):
    ev = _write(tmp_path / "r.jsonl", [
        {"id": "nq-1", "question": "Who wrote Hamlet?", "tool_calls": [{"observation": "A"}, {"observation": "B"}]},
        {"id": "nq-2", "question": "Capital of France", "tool_calls": []}])
    tool = FixedRetrieval(ev, QA)
    m1 = {"uid": "nq-1", "sample": 0, "question": "Who wrote Hamlet?"}
    m1b = {"uid": "nq-1", "sample": 1, "question": "Who wrote Hamlet?"}
    # matched by question text (normalised) when the uid differs: another run's uids need not agree
    other = {"uid": "nq_test-77", "sample": 0, "question": "who wrote hamlet"}
    none = {"uid": "nq-2", "sample": 0, "question": "Capital of France"}
    assert tool(["q1", "q1", "q", "q"], [m1, m1b, other, none]) == ["A", "A", "A", ""]
    assert tool(["q2"], [m1]) == ["B"]
    assert tool(["q3"], [m1]) == ["B"]  # past the recorded calls: the last recorded observation
    tool.reset()
    assert tool(["again"], [m1]) == ["A"]
    assert dict(tool.stats) == {"replayed": 5, "no_recorded_retrieval": 1, "past_recorded_calls": 1}
