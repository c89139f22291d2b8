"""Evaluation sets, the paper table and the reports — no model involved."""

import csv
import json
import math

import pytest

from dart_jax.data.paths import DATA
from dart_jax.data.readers import _json_records
from dart_jax.eval import paper
from dart_jax.eval.datasets import EVAL_SETS, EvalSet, default_sets, load_set, resolve
from dart_jax.eval.report import markdown, paper_table, write_reports
from dart_jax.eval.runner import SQL_MEAN, group_scores, per_question_accuracy, score_qa, score_sql, summarize
from dart_jax.rewards.sql import execution_match


@pytest.mark.parametrize("name,questions,no_db", [
    ("nq", 1000, 0), ("triviaqa", 1000, 0), ("popqa", 1000, 0), ("hotpotqa", 1000, 0), ("2wiki", 1000, 0),
    ("musique", 1000, 0), ("bamboogle", 125, 0), ("nq_corpus_heldout", 253, 0), ("hotpotqa_corpus", 300, 0),
    ("spider_dev", 972, 62), ("spider_dk", 473, 62), ("spider_realistic", 476, 32), ("spider_syn", 972, 62)])
def test_every_shipped_set_loads_with_its_counts(name, questions, no_db):
    rows, counts = load_set(EVAL_SETS[name])
    assert counts == {"questions": questions, "skipped_no_db": no_db}
    assert len({r["id"] for r in rows}) == len(rows)
    assert all(r["question"] for r in rows)
    if EVAL_SETS[name].task == "qa":
        assert all(r["golden_answers"] and all(isinstance(a, str) for a in r["golden_answers"]) for r in rows)


def test_corpus_sets_are_held_out_from_the_quickstart_and_cea_training():
    """nq_corpus_heldout = the quickstart's held-out slice (rows after its GRPO prompts and warm-start
    demonstrations, NQ evaluation questions removed); hotpotqa_corpus's first 64 are what
    configs/cea_quickstart.py:hotpotqa holds out."""
    from configs import cea_quickstart, quickstart, sft_quickstart
    from dart_jax.data.readers import load_rows, question_key
    held = load_set(EVAL_SETS["nq_corpus_heldout"])[0]
    assert [r["id"] for r in held[:32]] == [r["id"] for r in load_rows(quickstart.get_config().eval.data[0], DATA)]
    keys = {question_key(r) for r in held}
    for spec in (cea_quickstart.get_config().data.train[0], sft_quickstart.get_config().sft.data[0],
                 *[s.exclusion_spec() for s in (EVAL_SETS["nq"],)]):
        assert not keys & {question_key(r) for r in load_rows(dict(spec), DATA, require_db=False)}, spec
    hot = cea_quickstart.get_config("hotpotqa")
    train = {question_key(r) for r in load_rows(hot.data.train[0], DATA)}
    assert len(train) == 207 and not train & {question_key(r) for r in load_set(EVAL_SETS["hotpotqa_corpus"], 64)[0]}


def test_limit_takes_the_first_questions_then_skips_missing_databases():
    records = _json_records(f"{DATA}/spider/dev_questions.jsonl")
    first_wta = next(k for k, r in enumerate(records) if r["db_id"] == "wta_1")
    limit = first_wta + 5
    rows, counts = load_set(EVAL_SETS["spider_dev"], limit=limit)
    assert counts == {"questions": limit - 5, "skipped_no_db": 5}  # never silently scored 0
    assert [r["question"] for r in rows] == [r["question"] for r in records[:limit] if r["db_id"] != "wta_1"]


def test_spider_dk_reads_its_own_databases_first():
    rows, _ = load_set(EVAL_SETS["spider_dk"])
    new = [r for r in rows if r["db_id"].startswith("new_")]
    assert new and all("/dk_database/" in r["db_path"] for r in new)
    assert all("/spider/database/" in r["db_path"] for r in rows if not r["db_id"].startswith("new_"))


@pytest.mark.parametrize("name,runnable", [("spider_dk", 472), ("spider_realistic", 476), ("spider_syn", 972)])
def test_spider_family_gold_queries_score_one_against_themselves(name, runnable):
    rows, _ = load_set(EVAL_SETS[name])
    ok = 0
    for r in rows:
        try:
            ok += execution_match(r["db_path"], r["query"], r["query"], "spider")[0]
        except ValueError:  # the gold query itself fails (one upstream Spider-DK query): skipped, counted
            pass
    assert ok == runnable


def test_bird_needs_a_database_root_and_missing_files_name_themselves(tmp_path):
    with pytest.raises(FileNotFoundError, match="--db-root"):
        load_set(EVAL_SETS["bird_dev"])
    with pytest.raises(FileNotFoundError, match="none of the 3 questions has its database"):
        load_set(EVAL_SETS["bird_dev"], limit=3, db_root=str(tmp_path))
    with pytest.raises(FileNotFoundError, match="nowhere.jsonl"):
        load_set(EvalSet("x", "qa", "X", "flashrag", str(tmp_path / "nowhere.jsonl")))
    assert "bird_dev" not in default_sets("sql") and "bird_dev" in default_sets("sql", str(tmp_path))
    with pytest.raises(ValueError, match="is a sql set"):
        resolve(["spider_dev"], "qa")
    with pytest.raises(ValueError, match="unknown dataset"):
        resolve(["nq_full"], "qa")


def test_scoring_by_hand():
    assert score_qa("<think>x</think><answer> the Eiffel Tower </answer>", ["Eiffel tower"])["score"] == 1.0
    r = score_qa("<information>Doc 1 Paris is the capital</information><answer>Lyon</answer>", ["Paris"])
    assert r == {"answer": "Lyon", "score": 0.0, "retrieval_hit": True}
    db = f"{DATA}/spider/database/concert_singer/concert_singer.sqlite"
    gold = "SELECT count(*) FROM singer"
    assert score_sql(f"<think>x</think><solution>{gold}</solution>", db, gold, "spider", 5)["score"] == 1.0
    assert score_sql("<solution>SELECT count(*) FROM stadium</solution>", db, gold, "spider", 5)["score"] == 0.0
    assert score_sql("no solution here", db, gold, "spider", 5) == {"solution": None, "score": 0.0,
                                                                     "error": "no <solution>"}
    bad = score_sql("<solution>SELECT nope FROM singer</solution>", db, gold, "spider", 5)
    assert bad["score"] == 0.0 and "no such column" in bad["error"]
    # DISTINCT as written (ours) vs deleted from both queries (test-suite's default; tests/rewards)
    distinct = "<solution>SELECT DISTINCT country FROM singer</solution>"
    assert score_sql(distinct, db, "SELECT country FROM singer", "spider", 5)["score"] == 0.0
    assert score_sql(distinct, db, "SELECT country FROM singer", "spider", 5, keep_distinct=False)["score"] == 1.0
    # BIRD runs queries as written whatever the option: count 6 against COUNT(DISTINCT) 3 stays wrong
    count = "<solution>SELECT count(country) FROM singer</solution>"
    assert score_sql(count, db, "SELECT count(DISTINCT country) FROM singer", "spider", 5,
                     keep_distinct=False)["score"] == 1.0
    assert score_sql(count, db, "SELECT count(DISTINCT country) FROM singer", "bird", 5,
                     keep_distinct=False)["score"] == 0.0


def test_group_averages_by_hand():
    res = {n: {"score": s, "trajectories": 1} for n, s in
           zip(("nq", "triviaqa", "popqa", "hotpotqa", "2wiki", "musique", "bamboogle"), (.1, .2, .3, .4, .5, .6, .7))}
    g = group_scores("qa", res)
    assert g["Gen-Avg"] == pytest.approx(0.2) and g["MH-Avg"] == pytest.approx(0.55)
    assert g["Avg"] == pytest.approx(0.4)
    del res["bamboogle"]  # an incomplete group is not averaged
    assert set(group_scores("qa", res)) == {"Gen-Avg"}
    assert group_scores("sql", {"spider_dev": {"score": .5, "trajectories": 2},
                                "spider_dk": {"score": .25, "trajectories": 2}}) == {SQL_MEAN: 0.375}
    # the in-distribution probe (a run's own training questions) is reported but never averaged in
    assert group_scores("sql", {"spider_dev_heldout_easy": {"score": .5, "trajectories": 2},
                                "spider_dev_train_easy": {"score": .9, "trajectories": 2}}) == {SQL_MEAN: 0.5}


def test_paper_numbers_are_consistent_with_their_averages():
    for key, row in paper.PAPER_QA.items():
        if "nq" in row:  # per-dataset rows: the paper's Avg is the mean of the seven
            assert sum(row[k] for k in paper.QA_COLUMNS) / 7 == pytest.approx(row["Avg"], abs=6e-4), key
    dart = paper.PAPER_SQL[("dart", "qwen2.5-coder-7b")]
    assert sum(v for k, v in dart.items() if k != "Avg") / 6 == pytest.approx(dart["Avg"], abs=1e-4)
    assert paper.model_key("/models/Qwen2.5-3B-Instruct") == "qwen2.5-3b-instruct"
    assert paper.model_key("Qwen2.5-3B") == "qwen2.5-3b-base"
    assert paper.model_key("Meta-Llama-3.1-8B-Instruct") == "llama3.1-8b-instruct"
    assert paper.model_key("Qwen2.5-Coder-7B-Instruct") == "qwen2.5-coder-7b"
    assert paper.model_key("smollm2-135m-instruct") is None
    assert paper.method_key("qa", "full", 8) == "search_r1" and paper.method_key("qa", "lora", 16) == "lora16"


def _fake_results(model_key, method, scores):
    recs = {}
    for name, s in scores.items():
        es = EVAL_SETS[name]
        traj = [{"score": float(k < round(s * 4)), "finish": "answer", "tool_calls": [], "response_tokens": 10,
                 "retrieval_hit": True, "dataset": name, "id": f"{name}-{k}", "question": "q"} for k in range(4)]
        recs[name] = summarize(es, [{}] * 4, traj, {"skipped_no_db": 0}, 1, 1.0)
    return {"setup": {"task": "qa", "policy": "test policy", "n_samples": 1, "temperature": 0.0, "limit": 4,
                      "model": "x", "paper_model": model_key, "paper_method": method, "compare": []},
            "datasets": recs, "groups": group_scores("qa", recs)}


def test_side_by_side_with_the_matching_paper_row(tmp_path):
    scores = dict(zip(paper.QA_COLUMNS, (0.5, 0.5, 0.5, 0.25, 0.25, 0.0, 0.25)))
    res = _fake_results("qwen2.5-3b-base", "dart", scores)
    table = paper_table(res)
    assert "Setup matches the paper's DART (qwen2.5-3b-base)" in table
    delta = next(line for line in table.splitlines() if line.startswith("| Δ"))
    assert delta.split("|")[2].strip() == f"{0.5 - 0.457:.3f}"  # NQ: ours − paper
    other = paper_table(_fake_results(None, "dart", scores))
    assert "orientation only" in other and "Δ" not in other
    paths = write_reports(str(tmp_path), res)
    rows = list(csv.DictReader(open(paths["csv"])))
    assert [r["name"] for r in rows] == list(paper.QA_COLUMNS) + ["Gen-Avg", "MH-Avg", "Avg"]
    assert float(rows[0]["score"]) == 0.5
    assert json.load(open(paths["json"]))["groups"]["Avg"] == pytest.approx(sum(scores.values()) / 7)
    md = open(paths["markdown"]).read()
    assert md == markdown(res) and "| test policy | 0.500 |" in md
    assert "DISTINCT" not in md                      # the EX convention is named only when it is not ours
    res["setup"]["keep_distinct"] = False
    assert "DISTINCT" not in markdown(res)           # … and only where a set is scored with Spider semantics
    next(iter(res["datasets"].values()))["semantics"] = "spider"
    assert "DISTINCT deleted from both queries" in markdown(res)


def test_per_question_accuracy_is_the_mean_over_samples():
    recs = [{"dataset": "nq", "id": "a", "question": "qa", "score": s} for s in (1, 0, 1, 1)]
    recs += [{"dataset": "nq", "id": "b", "question": "qb", "score": 0.0} for _ in range(4)]
    got = {r["id"]: r for r in per_question_accuracy(recs)}
    assert got["a"]["n"] == 4 and got["a"]["accuracy"] == 0.75 and got["b"]["accuracy"] == 0.0
    assert not math.isnan(got["a"]["correct"])
