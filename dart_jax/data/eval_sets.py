"""The evaluation slices shipped in data/, rebuilt from the benchmark data collected for the project.

QA (FlashRAG rows {"id", "question", "golden_answers", "data_source"}), the paper's seven sets:
NQ / TriviaQA / PopQA test samples (FlashRAG's 1,000-question subsamples, original ids; NQ copied as is), HotpotQA /
2Wiki / MuSiQue dev (the first 1,000 questions of the full dev files), Bamboogle test (all 125).
SQL ({"id", "db_id", "question", "query"} per line): Spider-DK (+ its three new databases),
Spider-Realistic, Spider-Syn (the synonym-substituted question), BIRD dev and mini-dev (questions
only: BIRD's databases are 1.4 GB and come from the user's --db-root).
"""

from __future__ import annotations

import json
import os
import shutil

from dart_jax.data.corpus import read_jsonl, write_jsonl

QA_LIMIT = 1000


def _flashrag(path: str, source: str, limit: int | None = None) -> list[dict]:
    rows = []
    for k, r in enumerate(read_jsonl(path)):
        if limit is not None and k >= limit:
            break
        rows.append({"id": f"{source}-{r['id']}", "question": r["question"],
                     "golden_answers": list(r["golden_answers"]), "data_source": source})
    return rows


def _qa_json(path: str, source: str, limit: int) -> list[dict]:
    with open(path) as f:
        data = json.load(f)
    return [{"id": f"{source}-dev-{k}", "question": r["question"],
             "golden_answers": [r["answer"]] if isinstance(r["answer"], str) else list(r["answer"]),
             "data_source": source} for k, r in enumerate(data[:limit])]


def _sql(path: str, source: str, question_field: str = "question", sql_field: str = "query",
         keep: tuple[str, ...] = ()) -> list[dict]:
    with open(path) as f:
        data = json.load(f)
    out = []
    for k, r in enumerate(data):
        row = {"id": f"{source}-{r.get('question_id', k)}", "db_id": r["db_id"], "question": r[question_field],
               "query": r[sql_field]}
        row.update({f: r[f] for f in keep if f in r})
        out.append(row)
    return out


def build_eval_sets(shared: str, out: str) -> dict[str, int]:
    """Write every evaluation slice under `out` (data/); -> rows per file."""
    qa = os.path.join(shared, "qa")
    files = {
        "qa/triviaqa_test_sample1000.jsonl": _flashrag(os.path.join(qa, "triviaqa", "test_sample1000.jsonl"),
                                                       "triviaqa"),
        "qa/popqa_test_sample1000.jsonl": _flashrag(os.path.join(qa, "popqa", "test_sample1000.jsonl"), "popqa"),
        "qa/bamboogle_test.jsonl": _flashrag(os.path.join(qa, "bamboogle", "test.jsonl"), "bamboogle"),
        "qa/hotpotqa_dev1000.jsonl": _qa_json(os.path.join(qa, "hotpotqa", "dev_full_qa.json"), "hotpotqa", QA_LIMIT),
        "qa/2wiki_dev1000.jsonl": _qa_json(os.path.join(qa, "2wikimultihopqa", "dev_full_qa.json"), "2wiki",
                                           QA_LIMIT),
        "qa/musique_dev1000.jsonl": _qa_json(os.path.join(qa, "musique", "dev_full_qa.json"), "musique", QA_LIMIT),
        "spider/dk_questions.jsonl": _sql(os.path.join(shared, "spider_dk", "Spider-DK.json"), "spider_dk",
                                          keep=("type",)),
        "spider/realistic_questions.jsonl": _sql(os.path.join(shared, "spider_realistic", "spider-realistic.json"),
                                                 "spider_realistic"),
        "spider/syn_questions.jsonl": _sql(os.path.join(shared, "spider_syn", "dev.json"), "spider_syn",
                                           question_field="SpiderSynQuestion", keep=("SpiderQuestion",)),
        "bird/dev.jsonl": _sql(os.path.join(shared, "bird", "dev_full_1534.json"), "bird_dev", sql_field="sql",
                               keep=("evidence", "difficulty")),
        "bird/mini_dev.jsonl": _sql(os.path.join(shared, "bird", "mini_dev", "mini_dev_sqlite.json"), "bird_mini_dev",
                                    sql_field="SQL", keep=("evidence", "difficulty")),
    }
    counts = {name: write_jsonl(os.path.join(out, name), rows) for name, rows in files.items()}
    shutil.copyfile(os.path.join(qa, "nq_open", "test_sample1000.jsonl"),
                    os.path.join(out, "qa", "nq_test_sample1000.jsonl"))
    counts["qa/nq_test_sample1000.jsonl"] = 1000
    src = os.path.join(shared, "spider_dk", "database")
    for db in sorted(os.listdir(src)):
        dst = os.path.join(out, "spider", "dk_database", db)
        os.makedirs(dst, exist_ok=True)
        shutil.copyfile(os.path.join(src, db, f"{db}.sqlite"), os.path.join(dst, f"{db}.sqlite"))
    for name in ("spider_dk", "spider_syn"):
        shutil.copyfile(os.path.join(shared, name, "LICENSE.source"), os.path.join(out, "spider", f"LICENSE.{name}"))
    return counts
