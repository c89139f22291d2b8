"""Stand-ins for the public training files of the paper's two settings, in their published formats,
so tests and recipe rehearsals run launch.prepare_data and the paper configs on the real layout:

- Search-R1's NQ + HotpotQA `train.parquet` (Hugging Face dataset PeterJinGo/nq_hotpotqa_train), as
  Search-R1's scripts/data_process/qa_search_train_merge.py writes it: FlashRAG's columns (`id`,
  `question` stripped and ending in "?", `golden_answers`, `metadata`) followed by `data_source`,
  `prompt` (one user message: the base template + "Question: …"), `ability`, `reward_model`
  ({"style": "rule", "ground_truth": {"target": answers}}) and `extra_info` ({"split", "index"}).
- SkyRL-SQL-653 `train.parquet` (NovaSky-AI/SkyRL-SQL-653-data-newfmt): `data_source`, `prompt`
  (system + user message '{db_details}:…;\\n {external_knowledge}: …;\\n {question}: …'),
  `env_class`, `reward_spec` ({"method": "rule", "ground_truth": SQL}), `db_id`, `data`
  (synsql | spider | bird), `extra_info`.
- a database root in OmniSQL's data/ layout ({root}/spider/database/<db>/<db>.sqlite,
  {root}/SynSQL-2.5M/databases/<db>/<db>.sqlite) holding real SQLite files: Spider dev databases
  copied from data/spider/database, SynSQL-style databases built with sqlite3.
"""

from __future__ import annotations

import os
import shutil
import sqlite3

import pyarrow as pa
import pyarrow.parquet as pq

from dart_jax.data.paths import DATA

# Search-R1's `make_prefix(template_type="base")`, before "Question: {question}\n"
SEARCH_R1_PREFIX = (
    "Answer the given question. You must conduct reasoning inside <think> and </think> first every time you "
    "get new information. After reasoning, if you find you lack some knowledge, you can call a search engine "
    "by <search> query </search> and it will return the top searched results between <information> and "
    "</information>. You can search as many times as your want. If you find no further external knowledge "
    "needed, you can directly provide the answer inside <answer> and </answer>, without detailed "
    "illustrations. For example, <answer> Beijing </answer>. ")

_MESSAGES = pa.list_(pa.struct([("content", pa.string()), ("role", pa.string())]))
SEARCH_R1_SCHEMA = pa.schema([
    ("id", pa.string()), ("question", pa.string()), ("golden_answers", pa.list_(pa.string())),
    ("metadata", pa.struct([("type", pa.string()), ("level", pa.string())])),
    ("data_source", pa.string()), ("prompt", _MESSAGES), ("ability", pa.string()),
    ("reward_model", pa.struct([("ground_truth", pa.struct([("target", pa.list_(pa.string()))])),
                                ("style", pa.string())])),
    ("extra_info", pa.struct([("index", pa.int64()), ("split", pa.string())])),
])

SKYRL_SYSTEM = ("Task Overview:\nYou are a data science expert. Below, you are provided with a database schema "
                "and a natural language question. Your task is to understand the schema and generate a valid SQL "
                "query to answer the question within limited turns. ... The returned dataframe will be "
                "truncated in 50 rows if observation is too long.")
SKYRL_SCHEMA = pa.schema([
    ("data_source", pa.string()), ("prompt", _MESSAGES), ("env_class", pa.string()),
    ("reward_spec", pa.struct([("ground_truth", pa.string()), ("method", pa.string())])),
    ("db_id", pa.string()), ("data", pa.string()),
    ("extra_info", pa.struct([("index", pa.int64()), ("split", pa.string())])),
])


def search_r1_row(data_source: str, index: int, question: str, answers: list[str] | None,
                  id: str | None = None, metadata: dict | None = None) -> dict:
    """One row of Search-R1's merged train set: FlashRAG row `index` of `data_source` (id
    "train_{index}" unless given) mapped by qa_search_train_merge.py. `answers=None` writes no
    answers at all (a malformed row)."""
    q = question.strip()
    q = q if q.endswith("?") else q + "?"
    return {"id": f"train_{index}" if id is None else id, "question": q, "golden_answers": answers,
            "metadata": metadata, "data_source": data_source,
            "prompt": [{"role": "user", "content": f"{SEARCH_R1_PREFIX}Question: {q}\n"}],
            "ability": "fact-reasoning",
            "reward_model": {"style": "rule", "ground_truth": {"target": answers}},
            "extra_info": {"split": "train", "index": index}}


def write_search_r1_train(path: str, rows: list[dict]) -> str:
    """Rows (`search_r1_row`) -> a parquet file with the published schema."""
    os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
    pq.write_table(pa.Table.from_pylist(rows, schema=SEARCH_R1_SCHEMA), path)
    return path


def skyrl_sql_row(db_id: str, data: str, question: str, sql: str | None, evidence: str = "",
                  ddl: str = "CREATE TABLE t (a int)", index: int = 0) -> dict:
    """One SkyRL-SQL-653 row (newfmt). `sql=None` writes no gold SQL (a malformed row)."""
    user = "{db_details}:" + ddl + ";\n {external_knowledge}: " + evidence + ";\n {question}: " + question
    return {"data_source": "synsql", "prompt": [{"role": "system", "content": SKYRL_SYSTEM},
                                                {"role": "user", "content": user}],
            "env_class": "text2sql", "reward_spec": {"method": "rule", "ground_truth": sql},
            "db_id": db_id, "data": data, "extra_info": {"split": "train", "index": index}}


def write_skyrl_sql_653(path: str, rows: list[dict]) -> str:
    """Rows (`skyrl_sql_row`) -> a parquet file with the published schema."""
    os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
    pq.write_table(pa.Table.from_pylist(rows, schema=SKYRL_SCHEMA), path)
    return path


# SynSQL-style databases: db_id -> (table, its DDL, its rows)
SYNSQL_DBS = {
    "synsql_shop": ("products", "CREATE TABLE products (id INTEGER PRIMARY KEY, name TEXT, price REAL)",
                    [(1, "pen", 2.5), (2, "lamp", 19.0), (3, "desk", 120.0)]),
}


def omnisql_db_root(root: str, spider: tuple[str, ...] = ("concert_singer", "pets_1"),
                    synsql: tuple[str, ...] = ("synsql_shop",)) -> str:
    """OmniSQL's data/ folder under `root` with the shipped Spider dev databases `spider` (copied)
    and the SynSQL-style databases `synsql` (built, see SYNSQL_DBS) -> the root."""
    for db in spider:
        dst = os.path.join(root, "spider", "database", db)
        os.makedirs(dst, exist_ok=True)
        shutil.copy(os.path.join(DATA, "spider", "database", db, f"{db}.sqlite"), dst)
    for db in synsql:
        table, ddl, rows = SYNSQL_DBS[db]
        dst = os.path.join(root, "SynSQL-2.5M", "databases", db)
        os.makedirs(dst, exist_ok=True)
        con = sqlite3.connect(os.path.join(dst, f"{db}.sqlite"))
        con.execute(ddl)
        con.executemany(f"INSERT INTO {table} VALUES ({', '.join('?' * len(rows[0]))})", rows)
        con.commit()
        con.close()
    return root


def sample_search_r1_train(path: str, n_nq: int = 8, n_hotpot: int = 8) -> str:
    """A small Search-R1 train.parquet for rehearsals: NQ and HotpotQA questions whose evidence is in
    the shipped corpus (data/qa/nq_oracle.jsonl, data/qa/hotpotqa_sample300.jsonl), none of them in a
    shipped evaluation set, so launch.prepare_data qa keeps every row."""
    from dart_jax.data.corpus import read_jsonl
    from dart_jax.data.readers import exclude_questions, load_rows
    from dart_jax.eval.datasets import exclusion_specs
    held = [r for spec in exclusion_specs("qa") for r in load_rows(dict(spec), require_db=False)]
    rows = []
    for name, source, n in (("nq_oracle.jsonl", "nq", n_nq), ("hotpotqa_sample300.jsonl", "hotpotqa", n_hotpot)):
        kept, _ = exclude_questions(list(read_jsonl(os.path.join(DATA, "qa", name))), held)
        for k, r in enumerate(kept[:n]):
            rid = str(r["id"]).removeprefix(f"{source}-")
            rows.append(search_r1_row(source, k, r["question"], list(r["golden_answers"]), id=rid))
    return write_search_r1_train(path, rows)


# hand-written SkyRL-style questions (none in a shipped evaluation set) on the databases omnisql_db_root builds
SAMPLE_SQL = (
    ("concert_singer", "spider", "How many concerts were held in 2014?",
     "SELECT count(*) FROM concert WHERE year = 2014"),
    ("concert_singer", "spider", "List the names of stadiums with a capacity above 5000.",
     "SELECT name FROM stadium WHERE capacity > 5000"),
    ("concert_singer", "spider", "What is the age of the oldest singer?", "SELECT max(age) FROM singer"),
    ("pets_1", "spider", "How many pets weigh more than 10?", "SELECT count(*) FROM pets WHERE weight > 10"),
    ("pets_1", "spider", "How many students have a dog?",
     "SELECT count(DISTINCT T1.stuid) FROM has_pet AS T1 JOIN pets AS T2 ON T1.petid = T2.petid "
     "WHERE T2.pettype = 'dog'"),
    ("synsql_shop", "synsql", "How many products cost more than 10?", "SELECT count(*) FROM products WHERE price > 10"),
    ("synsql_shop", "synsql", "What is the name of the cheapest product?",
     "SELECT name FROM products ORDER BY price LIMIT 1"),
    ("synsql_shop", "synsql", "What is the total price of all products?", "SELECT sum(price) FROM products"),
)


def sample_skyrl_sql(path: str, db_root: str) -> tuple[str, str]:
    """A small SkyRL-SQL-653 train.parquet (SAMPLE_SQL) and its OmniSQL-layout database root, for
    rehearsals: launch.prepare_data sql keeps every row. -> (parquet path, database root)."""
    omnisql_db_root(db_root)
    rows = [skyrl_sql_row(db, kind, q, sql, index=k) for k, (db, kind, q, sql) in enumerate(SAMPLE_SQL)]
    return write_skyrl_sql_653(path, rows), db_root
