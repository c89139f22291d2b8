"""Warm-start demonstrations: built from the real retriever / the real Spider databases, encoded as
the agent's id stream (observations tokenised alone, loss 0), filtered for self-distillation, and
kept free of evaluation questions."""

import json

import pytest

from configs import quickstart, sft_quickstart
from dart_jax.data.paths import DATA
from dart_jax.data.readers import exclude_questions, load_rows, question_key
from dart_jax.data.text import normalize_answer
from dart_jax.rewards.qa import em_reward
from dart_jax.rewards.sql import sql_training_reward
from dart_jax.rollout.agent import observation_ids
from dart_jax.rollout.protocol import QA, SQL
from dart_jax.rollout.tasks import qa_task, spider_rows
from dart_jax.run.spec import run_spec
from dart_jax.sft import demos as D
from dart_jax.sft.trainer import build_demos
from dart_jax.tokenization.sentinels import add_sentinel_tokens, sentinel_ids
from dart_jax.tokenization.tokenizer import load_tokenizer
from dart_jax.tools.retrieval import RetrievalTool, Retriever, ensure_index
from dart_jax.tools.sqlite_exec import SQLiteTool

ROOT = DATA.rsplit("/", 1)[0]


@pytest.fixture(scope="module")
def tagged_tok():
    tok = load_tokenizer("smollm2-135m-instruct")
    add_sentinel_tokens(tok)
    return tok


@pytest.fixture(scope="module")
def retrieval():
    return RetrievalTool(Retriever(ensure_index()), topk=1)


def test_qa_demos_show_the_real_retrieval_and_mask_observations(tagged_tok, retrieval):
    rows = load_rows(sft_quickstart.nq_oracle(sft_quickstart.RL_ROWS, 6), ROOT)
    rows.append({"id": "nq-fake", "question": "who wrote the first nobel prize in physics speech",
                 "golden_answers": ["Zqxv Plonk"], "data_source": "nq"})
    demos, stats = D.qa_demos(rows, retrieval, tagged_tok, max_obs_tokens=192)
    assert stats["rows"] == 7 and stats["no_evidence"] >= 1 and stats["kept"] == len(demos) >= 5
    assert "nq-fake" not in {d["id"] for d in demos}
    ids = sentinel_ids(tagged_tok, ("<search>", "</search>"))
    for d in demos:
        query = d["pieces"][0]["text"].split("<search>")[1].split("</search>")[0].strip()
        assert d["pieces"][1]["text"] == QA.render_observation(retrieval.batch([query])[0])  # the tool's own output
        written = d["pieces"][0]["text"] + d["pieces"][2]["text"]
        assert em_reward(written, d["golden_answers"]) == 1.0
        prompt, resp, mask = D.encode_demo(tagged_tok, d, 192)
        assert prompt == qa_task(tagged_tok, [d])[0][0]  # the task's own chat prompt
        obs = observation_ids(tagged_tok, QA, d["pieces"][1]["text"], 192)
        first = tagged_tok.encode(d["pieces"][0]["text"], add_special_tokens=False)
        assert resp[:len(first)] == first and first.count(ids["<search>"]) == 1 and first[-1] == ids["</search>"]
        assert resp[len(first):len(first) + len(obs)] == obs
        assert mask == [1.0] * len(first) + [0.0] * len(obs) + [1.0] * (len(resp) - len(first) - len(obs))
        visible = normalize_answer(tagged_tok.decode(obs, skip_special_tokens=True))
        answer = d["pieces"][2]["text"].split("<answer>")[1].split("</answer>")[0]
        assert normalize_answer(answer) in visible  # the demonstration answers from evidence it shows


def test_sql_demos_explore_the_real_database(tagged_tok):
    rows = spider_rows(n=6)
    rows.append(dict(rows[0], id="broken", query="SELECT no_such_column FROM no_such_table"))
    tool = SQLiteTool()
    demos, stats = D.sql_demos(rows, tool, max_turns=2)
    assert stats["gold_fails"] == 1 and len(demos) == 6
    for d in demos:
        explore = d["pieces"][0]["text"].split("<sql>")[1].split("</sql>")[0].strip()
        assert explore.startswith("SELECT * FROM ") and explore.endswith(" LIMIT 3")
        assert d["pieces"][1]["text"] == SQL.render_observation(tool.batch([explore], [d["db_path"]])[0], 1)
        assert "error" not in d["pieces"][1]["text"].lower()
        written = d["pieces"][0]["text"] + d["pieces"][2]["text"]
        assert sql_training_reward(written, d["db_path"], d["query"]) == 1.0
        _, resp, mask = D.encode_demo(tagged_tok, d, 512)
        assert 0.0 in mask and mask[0] == 1.0 and mask[-1] == 1.0


def _record(uid, pieces, score=1.0, finish="answer", **kw):
    return {"step": 1, "uid": uid, "data_source": "nq", "task": "qa", "question": f"q {uid}", "pieces": pieces,
            "score": score, "accuracy": score, "finish": finish, "golden_answers": ["x"], **kw}


def test_distill_keeps_correct_finished_balanced_trajectories(tmp_path):
    good = [{"text": "<think> a </think>\n<search> q </search>", "loss": 1},
            {"text": "\n\n<information>Doc 1 x</information>\n\n", "loss": 0},
            {"text": "<think> b </think>\n<answer> x </answer>", "loss": 1}]
    unbalanced = [{"text": "<think> a <think> b </think>\n<answer> x </answer>", "loss": 1}]
    two_answers = [{"text": "<answer> y </answer><answer> x </answer>", "loss": 1}]
    path = tmp_path / "rollouts.jsonl"
    recs = [_record("u1", good), _record("u1", good), _record("u2", good, score=0.0),
            _record("u3", good, finish="length"), _record("u4", unbalanced), _record("u5", two_answers)]
    path.write_text("".join(json.dumps(r) + "\n" for r in recs))
    demos, stats = D.distill_demos(str(path))
    assert [d["id"] for d in demos] == ["u1"] and demos[0]["origin"] == "distill"
    assert stats == {"rows": 6, "kept": 1, "wrong": 1, "unfinished": 1, "unbalanced": 2, "duplicate": 1}
    assert D.balanced("<think> a </think>\n<search> q </search>\n<think> b </think>\n<answer> x </answer>", QA)
    assert not D.balanced("<think> a </think>\n<search> q \n<answer> x </answer>", QA)
    assert not D.balanced("<answer> x </answer> trailing words", QA)


def test_evaluation_questions_never_reach_warm_start_or_rl():
    held_out = load_rows(sft_quickstart.NQ_EVAL, ROOT)
    keys = {question_key(r) for r in held_out}
    sft_rows = [r for spec in sft_quickstart.get_config().sft.data for r in load_rows(
        {k: v for k, v in dict(spec).items() if k != "builder"}, ROOT)]
    rl_rows = [r for spec in quickstart.get_config().data.train for r in load_rows(dict(spec), ROOT)]
    assert len(held_out) == 1000 and len(sft_rows) == 640 and len(rl_rows) == 1024
    assert not keys & {question_key(r) for r in sft_rows}
    assert not keys & {question_key(r) for r in rl_rows}
    eval_rows = [r for spec in quickstart.get_config().eval.data for r in load_rows(dict(spec), ROOT)]
    assert len(eval_rows) == 32 and not keys & {question_key(r) for r in eval_rows}
    ids = [{r["id"] for r in rows} for rows in (sft_rows, rl_rows, eval_rows)]
    assert not ids[0] & ids[1] and not ids[0] & ids[2] and not ids[1] & ids[2]  # warm start, GRPO, held-out
    # the match is on the normalised question: case, punctuation and articles do not hide a question
    probe = {"id": "x", "question": "  Who TOLD the story of the Prodigal Son?", "golden_answers": ["y"]}
    assert exclude_questions([probe], held_out) == ([], 1)


def test_build_demos_drops_evaluation_questions_from_any_source(tmp_path, tagged_tok):
    c = sft_quickstart.get_config()
    leak = {"id": "leak", "task": "qa", "question": "who told the story of the prodigal son?",
            "golden_answers": ["Jesus Christ"], "pieces": [{"text": "<answer> Jesus Christ </answer>", "loss": 1}]}
    fine = dict(leak, id="fine", question="what colour is the shipped demonstration file")
    D.write_demos(str(tmp_path / "d.jsonl"), [leak, fine])
    c.sft.data = [dict(builder="file", path=str(tmp_path / "d.jsonl"))]
    demos, stats = build_demos(run_spec(c), tagged_tok)
    assert [d["id"] for d in demos] == ["fine"] and stats["excluded_eval_questions"] == 1
    c.sft.data = [dict(builder="nope", path="x")]
    with pytest.raises(ValueError, match="builder='nope'"):
        build_demos(run_spec(c), tagged_tok)
