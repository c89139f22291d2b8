"""Resuming an evaluation (dart_jax/eval/resume.py): an interrupted or extended run reuses exactly the
batches one uninterrupted run would sample, and samples the rest; the records equal that run's."""

import json
import os

import pytest

from configs import evaluate as eval_config
from dart_jax.eval.job import evaluate
from dart_jax.eval.resume import read_records, reusable
from dart_jax.eval.runner import EvalOptions


def _items(n_q, n):
    return [({"id": f"q{q}"}, k) for q in range(n_q) for k in range(n)]


def _recs(items):
    return [{"id": r["id"], "sample": k, "dataset": "d"} for r, k in items]


def test_reusable_keeps_whole_batches_of_the_same_size_in_order():
    new = _items(4, 2)  # 8 items, batches [0,3) [3,6) [6,8)
    assert reusable(new, None, 3) == []
    # an earlier run of 2 questions (4 items): its batches were [0,3) [3,4); only the first has the same size
    assert reusable(new, (4, _recs(_items(2, 2))), 3) == _recs(new)[:3]
    # an interrupted run of the same plan that wrote two batches
    assert reusable(new, (8, _recs(new)[:6]), 3) == _recs(new)[:6]
    # the whole plan done: everything is reused
    assert reusable(new, (8, _recs(new)), 3) == _recs(new)
    # a smaller run now: the earlier run's batch [3,6) is [3,4) here (another size): not reused
    assert reusable(_items(2, 2), (8, _recs(new)), 3) == _recs(new)[:3]
    # other items at the same positions (the set reordered): nothing reused from there on
    moved = _recs(new)
    moved[4]["id"] = "other"
    assert reusable(new, (8, moved), 3) == _recs(new)[:3]
    # a batch the earlier run planned but did not finish writing
    assert reusable(new, (8, _recs(new)[:5]), 3) == _recs(new)[:3]


def test_read_records_drops_a_cut_last_line_only(tmp_path):
    p = tmp_path / "r.jsonl"
    p.write_text('{"a": 1}\n{"a": 2}\n{"a": 3, "b"')
    assert read_records(str(p)) == [{"a": 1}, {"a": 2}]
    p.write_text('{"a": 1}\n{"a": \n{"a": 3}\n')
    with pytest.raises(ValueError, match="line 2 is not JSON"):
        read_records(str(p))


def _small(model_dir):
    c = eval_config.get_config("qa")
    c.model.path = model_dir
    c.retriever.topk = 1
    c.rollout.max_turns = 1
    c.rollout.max_tokens_per_turn = 10
    c.rollout.max_obs_tokens = 32
    c.rollout.max_response_tokens = 64
    c.mesh.shape = (1, 1, 1)
    return c


def _responses(out):
    return [(r["id"], r["sample"], r["response"]) for r in read_records(os.path.join(out, "per_question.jsonl"))]


def test_an_extended_or_interrupted_evaluation_equals_one_uninterrupted_run(tiny_smollm_dir, tmp_path):
    c = _small(tiny_smollm_dir)
    opts = lambda limit, seed=0: EvalOptions(n_samples=2, temperature=1.0, limit=limit, batch=4, seed=seed,  # noqa: E731
                                             progress=False)
    whole = evaluate(c, str(tmp_path / "whole"), ["nq"], opts(4))
    ref = _responses(tmp_path / "whole")
    assert len(ref) == 8 and len({r for _, _, r in ref}) > 2 and "resumed" not in whole["setup"]

    # 2 questions (one whole batch), then 4: the first batch is reused, the second sampled
    evaluate(c, str(tmp_path / "grow"), ["nq"], opts(2))
    grown = evaluate(c, str(tmp_path / "grow"), ["nq"], opts(4))
    assert grown["setup"]["resumed"] == {"nq": 4} and _responses(tmp_path / "grow") == ref
    assert grown["datasets"]["nq"]["trajectories"] == 8
    assert grown["datasets"]["nq"]["score"] == whole["datasets"]["nq"]["score"]
    acc = [json.loads(x) for x in open(grown["files"]["per_question_accuracy"])]
    assert [a["n"] for a in acc] == [2, 2, 2, 2]

    # 3 questions (batches of 4 and 2), then 4: the short batch is sampled again at its full size
    evaluate(c, str(tmp_path / "odd"), ["nq"], opts(3))
    odd = evaluate(c, str(tmp_path / "odd"), ["nq"], opts(4))
    assert odd["setup"]["resumed"] == {"nq": 4} and _responses(tmp_path / "odd") == ref

    # interrupted: the first batch and half a line written, no results.json (progress.json says the plan)
    cut = tmp_path / "cut"
    cut.mkdir()
    lines = open(tmp_path / "whole" / "per_question.jsonl").read().splitlines()
    (cut / "per_question.jsonl").write_text("\n".join(lines[:4]) + "\n" + lines[4][:30])
    (cut / "progress.json").write_text(open(tmp_path / "whole" / "progress.json").read())
    again = evaluate(c, str(cut), ["nq"], opts(4))
    assert again["setup"]["resumed"] == {"nq": 4} and _responses(cut) == ref

    # another compute dtype or mesh: the setup differs, nothing is reused
    c16 = _small(tiny_smollm_dir)
    c16.model.compute_dtype = "bfloat16"
    b16 = evaluate(c16, str(tmp_path / "grow"), ["nq"], opts(4))
    assert "resumed" not in b16["setup"] and b16["setup"]["model_config"]["compute_dtype"] == "bfloat16"
    assert not os.path.exists(tmp_path / "grow" / "per_question.jsonl.tmp")
    # another seed: nothing reused; and --noresume samples afresh
    other = evaluate(c, str(tmp_path / "grow"), ["nq"], opts(4, seed=1))
    assert "resumed" not in other["setup"] and _responses(tmp_path / "grow") != ref
    fresh = evaluate(c, str(tmp_path / "whole"), ["nq"], opts(4), resume_run=False)
    assert "resumed" not in fresh["setup"] and _responses(tmp_path / "whole") == ref
