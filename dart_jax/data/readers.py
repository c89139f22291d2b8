"""Dataset readers -> plain task rows, each with a unique prompt uid.

QA row:  {"id": uid, "question", "golden_answers": [str], "data_source"}
SQL row: {"id": uid, "question", "query" (gold SQL), "db_id", "db_path", "evidence", "data_source"}

Formats: Search-R1 parquet (`data_source`, `prompt`, `golden_answers`, `reward_model.ground_truth`),
FlashRAG jsonl (`id`, `question`, `golden_answers`), question/answer json lists, SkyRL-SQL rows,
Spider and BIRD json, and optionally tensorflow-datasets builders. The uid is
"{data_source}-{row id}": Search-R1's merged NQ + HotpotQA set reuses row indices per dataset, so a
bare index would merge unrelated questions into one GRPO group. Missing files and fields raise an
error naming the file, the row and the field. Text fields holding code points UTF-8 cannot encode
(lone surrogates, which valid JSON can carry) are made valid, each such code point U+FFFD
(`valid_rows`), and counted in one warning per file.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import random
import re
from typing import Any, Iterable, Sequence

from dart_jax.data.corpus import read_jsonl
from dart_jax.data.settings import prepare_hint
from dart_jax.data.text import normalize_answer, valid_text
from dart_jax.errors import UserError

log = logging.getLogger(__name__)


class DataError(UserError):
    """A dataset file or row the readers cannot use. `reason` is a short category ("missing
    question", "empty answers", …): launch.prepare_data counts the rows it drops by it."""

    def __init__(self, message: str, reason: str = "invalid row"):
        super().__init__(message)
        self.reason = reason


def _need(row: dict, field: str, path: str, k: int) -> Any:
    if field not in row or row[field] is None:
        raise DataError(f"{path}: row {k} has no field {field!r} (fields: {sorted(row)})", f"missing {field}")
    return row[field]


def _exists(path: str) -> str:
    if not os.path.isfile(path):
        raise FileNotFoundError(f"dataset file {path} not found")
    return path


TEXT_FIELDS = ("id", "question", "golden_answers", "query", "evidence", "data_source")


def valid_rows(rows: list[dict], path: str) -> list[dict]:
    """`rows` with every code point of their `TEXT_FIELDS` that UTF-8 cannot encode (a lone
    surrogate) replaced by U+FFFD (`data.text.valid_text`); valid rows are returned as they are. The
    replacements are counted in one warning naming the file."""
    replaced = touched = 0
    out = []
    for r in rows:
        n = 0
        fixed = {}
        for f in TEXT_FIELDS:
            v = r.get(f)
            if isinstance(v, str):
                fixed[f], k = valid_text(v)
                n += k
            elif isinstance(v, list) and all(isinstance(x, str) for x in v):
                pairs = [valid_text(x) for x in v]
                fixed[f] = [x for x, _ in pairs]
                n += sum(k for _, k in pairs)
        out.append({**r, **fixed} if n else r)
        replaced += n
        touched += bool(n)
    if replaced:
        log.warning("%s: %d invalid code points (lone surrogates) replaced by U+FFFD in %d rows",
                    path, replaced, touched)
    return out


def _answers(value, path: str, k: int) -> list[str]:
    if isinstance(value, str):
        return [value]
    if hasattr(value, "tolist"):
        value = value.tolist()
    if isinstance(value, dict) and "target" in value:
        return _answers(value["target"], path, k)
    if isinstance(value, (list, tuple)) and all(isinstance(v, str) for v in value) and value:
        return list(value)
    reason = ("missing answers" if value is None else
              "empty answers" if isinstance(value, (list, tuple)) and not value else "invalid answers")
    raise DataError(f"{path}: row {k} has golden answers {value!r}; expected a string or a non-empty list of strings",
                    reason)


_QUESTION = re.compile(r"Question:\s*(.*?)\s*$", re.S)


def search_r1_row(r: dict, path: str, k: int, data_source: str | None = None) -> dict:
    """Row `k` of a Search-R1 parquet as a task row: the question from `question` or the prompt's
    'Question: …' line, answers from `golden_answers` or `reward_model.ground_truth.target`, uid
    '{data_source}-{id}' (`id`, else `extra_info.index`, else k). Raises DataError (with its reason)."""
    source = data_source or _need(r, "data_source", path, k)
    if r.get("question"):
        question = r["question"]
    else:
        prompt = r.get("prompt")
        text = prompt[-1]["content"] if isinstance(prompt, list) and prompt else str(prompt or "")
        m = _QUESTION.search(text)
        if not m:
            raise DataError(f"{path}: row {k} has no 'question' and its prompt has no 'Question: …' line",
                            "missing question")
        question = m.group(1)
    if r.get("golden_answers") is not None:
        gold = _answers(r["golden_answers"], path, k)
    else:
        rm = r.get("reward_model")
        if rm is None or rm.get("ground_truth") is None:
            raise DataError(f"{path}: row {k} has neither 'golden_answers' nor 'reward_model.ground_truth'",
                            "missing answers")
        gold = _answers(rm["ground_truth"], path, k)
    rid = r.get("id") if r.get("id") is not None else (r.get("extra_info") or {}).get("index", k)
    return {"id": f"{source}-{rid}", "question": question, "golden_answers": gold, "data_source": source}


def read_search_r1_parquet(path: str, data_source: str | None = None) -> list[dict]:
    """Search-R1's `nq_search` / `nq_hotpotqa_train` parquet files."""
    import pyarrow.parquet as pq

    table = pq.read_table(_exists(path)).to_pylist()
    rows = [search_r1_row(r, path, k, data_source) for k, r in enumerate(table)]
    return _unique(valid_rows(rows, path), path)


def read_flashrag_jsonl(path: str, data_source: str | None = None) -> list[dict]:
    """FlashRAG jsonl: {"id", "question", "golden_answers", ...} per line."""
    source = data_source or os.path.basename(os.path.dirname(os.path.abspath(path)))
    rows = []
    for k, r in enumerate(read_jsonl(_exists(path))):
        q = _need(r, "question", path, k)
        gold = _answers(_need(r, "golden_answers", path, k), path, k)
        rid = str(r.get("id", k))
        uid = rid if rid.startswith(f"{r.get('data_source', source)}-") else f"{r.get('data_source', source)}-{rid}"
        rows.append({"id": uid, "question": q, "golden_answers": gold,
                     "data_source": r.get("data_source", source),
                     **({"lab": r["lab"]} if isinstance(r.get("lab"), dict) else {})})  # the lab's gold chain
    return _unique(valid_rows(rows, path), path)


def read_qa_json(path: str, data_source: str) -> list[dict]:
    """A json list of {"question", "answer" (str or list)} (the full NQ / HotpotQA / 2Wiki dev files)."""
    with open(_exists(path)) as f:
        data = json.load(f)
    rows = []
    for k, r in enumerate(data):
        rows.append({"id": f"{data_source}-{k}", "question": _need(r, "question", path, k),
                     "golden_answers": _answers(_need(r, "answer", path, k), path, k), "data_source": data_source})
    return valid_rows(rows, path)


def _json_records(path: str) -> list[dict]:
    if path.endswith(".jsonl"):
        return list(read_jsonl(_exists(path)))
    with open(_exists(path)) as f:
        data = json.load(f)
    if not isinstance(data, list):
        raise DataError(f"{path}: expected a json list of records, got {type(data).__name__}")
    return data


def db_roots(db_root) -> list[str]:
    """`db_root` as a list of directories: one path, a list, or paths joined by os.pathsep."""
    if not db_root:
        return []
    if isinstance(db_root, str):
        return [p for p in db_root.split(os.pathsep) if p]
    return [str(p) for p in db_root]


def _db_path(db_root, db_id: str) -> str:
    """DIR/<db_id>/<db_id>.sqlite in the first root that has it (Spider-DK: its own databases, then
    Spider's); the first root's path when none has it."""
    roots = db_roots(db_root) or [""]
    for root in roots:
        path = os.path.join(root, db_id, f"{db_id}.sqlite")
        if os.path.isfile(path):
            return path
    return os.path.join(roots[0], db_id, f"{db_id}.sqlite")


def _sql_rows(records: Iterable[dict], path: str, db_root: str, source: str, sql_fields: Sequence[str],
              question_field: str = "question", require_db: bool = True) -> tuple[list[dict], int]:
    """-> (rows whose database exists, count skipped for a missing database). `require_db=False`
    keeps every row (excluding evaluation questions needs their text, not their database)."""
    rows, missing, example = [], 0, ""
    for k, r in enumerate(records):
        db_id = _need(r, "db_id", path, k)
        sql = next((r[f] for f in sql_fields if r.get(f)), None)
        if sql is None:
            raise DataError(f"{path}: row {k} has no gold SQL (looked for {list(sql_fields)})")
        db = _db_path(db_root, db_id)
        if require_db and not os.path.isfile(db):
            missing += 1
            example = example or db
            continue
        rid = str(r.get("question_id", r.get("id", k)))
        rows.append({"id": rid if rid.startswith(f"{source}-") else f"{source}-{rid}",
                     "question": _need(r, question_field, path, k), "query": sql,
                     "db_id": db_id, "db_path": db, "evidence": r.get("evidence") or "", "data_source": source})
    _log_skipped(path, missing, "their database is not under the database root", example)
    return valid_rows(rows, path), missing


def _log_skipped(path: str, n: int, why: str, example: str = "") -> None:
    if n:
        log.warning("%s: %d rows skipped: %s%s", path, n, why, f" (e.g. {example})" if example else "")


def read_spider_json(path: str, db_root, data_source: str = "spider_dev", question_field: str = "question",
                     limit: int | None = None, require_db: bool = True) -> tuple[list[dict], int]:
    """Spider (and DK / Realistic / Syn: `question_field="SpiderSynQuestion"`) json lists or jsonl.
    `limit`: the first N questions of the file, before questions without a database are dropped."""
    data = _json_records(path)[:limit or None]
    return _sql_rows(data, path, db_root, data_source, ("query",), question_field, require_db)


def read_bird_json(path: str, db_root, data_source: str = "bird_dev",
                   limit: int | None = None, require_db: bool = True) -> tuple[list[dict], int]:
    """BIRD dev json ({"question_id", "db_id", "question", "evidence", "SQL"}); databases from `db_root`."""
    data = _json_records(path)[:limit or None]
    return _sql_rows(data, path, db_root, data_source, ("SQL", "sql", "query"), require_db=require_db)


# SkyRL-SQL's database folders per row `data` (skyrl-gym envs/sql/env.py): {root}/{folder}/{db_id}/{db_id}.sqlite
SKYRL_DB_FOLDERS = {"synsql": "SynSQL-2.5M/databases", "spider": "spider/database",
                    "bird": "bird/train/train_databases"}
_SKYRL_USER = re.compile(r"\{db_details\}:(?P<schema>.*?);\n \{external_knowledge\}: (?P<evidence>.*?);\n "
                         r"\{question\}: (?P<question>.*)\Z", re.S)


def _skyrl_question(r: dict, path: str, k: int) -> tuple[str, str]:
    """(question, external knowledge) of a SkyRL-SQL row: its own fields, else parsed from the user
    message '{db_details}:SCHEMA;\n {external_knowledge}: EVIDENCE;\n {question}: QUESTION'."""
    if r.get("question"):
        return str(r["question"]), str(r.get("external_knowledge") or r.get("evidence") or "")
    prompt = r.get("prompt")
    if hasattr(prompt, "tolist"):
        prompt = prompt.tolist()
    users = [m.get("content", "") for m in prompt or () if isinstance(m, dict) and m.get("role") == "user"]
    m = _SKYRL_USER.search(users[-1] or "") if users else None
    if m is None:
        raise DataError(f"{path}: row {k} has no 'question' and its user message is not SkyRL-SQL's "
                        "'{db_details}:…;\n {external_knowledge}: …;\n {question}: …'", "missing question")
    return m.group("question").strip(), m.group("evidence").strip()


def skyrl_sql_row(r: dict, path: str, k: int, roots: Sequence[str], data_source: str = "skyrl_sql") -> dict:
    """Row `k` of a SkyRL-SQL file as a task row (see `read_skyrl_sql`); `db_path` is the first
    candidate database that exists (the row's own `db_path`, written by launch.prepare_data, then
    each root's `{root}/{SKYRL_DB_FOLDERS[data]}/{db_id}/{db_id}.sqlite`), else the first candidate.
    Raises DataError (with its reason)."""
    db_id = _need(r, "db_id", path, k)
    spec = r.get("reward_spec") or r.get("reward_model") or {}
    gold = spec.get("ground_truth") or next((r[f] for f in ("sql", "SQL", "query", "gold_sql") if r.get(f)), None)
    if not gold:
        raise DataError(f"{path}: row {k} has no gold SQL (reward_spec.ground_truth, reward_model.ground_truth "
                        "or sql)", "missing gold SQL")
    kind = r.get("data")
    if kind is not None and kind not in SKYRL_DB_FOLDERS:
        raise DataError(f"{path}: row {k} has data={kind!r}; expected one of {sorted(SKYRL_DB_FOLDERS)}",
                        "unknown data kind")
    folders = [SKYRL_DB_FOLDERS[kind]] if kind else [""]
    candidates = ([r["db_path"]] if r.get("db_path") else []) + [
        os.path.join(root, f, db_id, f"{db_id}.sqlite") for root in (list(roots) or [""]) for f in folders]
    db = next((c for c in candidates if os.path.isfile(c)), candidates[0])
    question, evidence = _skyrl_question(r, path, k)
    return {"id": f"{data_source}-{k}", "question": question, "query": gold, "db_id": db_id,
            "db_path": db, "evidence": evidence, "data_source": data_source}


def read_skyrl_sql(path: str, db_root, data_source: str = "skyrl_sql", require_db: bool = True
                   ) -> tuple[list[dict], int]:
    """SkyRL-SQL-653 as published (NovaSky-AI/SkyRL-SQL-653-data-newfmt and the older verl-format
    SkyRL-SQL-653-data; parquet, or the same rows as json/jsonl): `prompt` (chat messages), `db_id`,
    `data` ∈ {synsql, spider, bird}, gold SQL in `reward_spec.ground_truth` (newfmt) or
    `reward_model.ground_truth` (verl format). The database of a row is
    `{root}/{SKYRL_DB_FOLDERS[data]}/{db_id}/{db_id}.sqlite` under the first `db_root` that has it
    (the `db_path` of SkyRL's env config: OmniSQL's data/ folder), or the row's own `db_path` (the
    files launch.prepare_data writes carry it, so they need no root). Rows with a flat `sql` and the
    database directly under the root (`{root}/{db_id}/{db_id}.sqlite`) are read too. The prompt is
    rebuilt by our SkyRL-SQL template (`data.prompts.sql_prompt`) from the question, the external
    knowledge and the DDL of the database, as for evaluation; uids are '{data_source}-{row}'."""
    if path.endswith(".parquet"):
        import pyarrow.parquet as pq
        records = pq.read_table(_exists(path)).to_pylist()
    else:
        records = _json_records(path)
    roots = db_roots(db_root)
    rows, missing, example = [], 0, ""
    for k, r in enumerate(records):
        row = skyrl_sql_row(r, path, k, roots, data_source)
        if require_db and not os.path.isfile(row["db_path"]):
            missing += 1
            example = example or row["db_path"]
            continue
        rows.append(row)
    _log_skipped(path, missing, "their database is not under the database root", example)
    return _unique(valid_rows(rows, path), path), missing


def read_tfds(name: str, split: str, data_source: str, data_dir: str | None = None,
              question_key: str = "question", answer_key: str = "answer") -> list[dict]:
    """A tensorflow-datasets builder already prepared in `data_dir` (nothing downloads)."""
    try:
        import tensorflow_datasets as tfds
    except ImportError as e:
        raise ImportError("reader 'tfds' needs tensorflow-datasets (pip install tensorflow-datasets)") from e
    ds = tfds.load(name, split=split, data_dir=data_dir, download=False)
    rows = []
    for k, ex in enumerate(tfds.as_numpy(ds)):
        ans = ex[answer_key]
        ans = [a.decode() if isinstance(a, bytes) else str(a) for a in (ans if hasattr(ans, "__len__") and
                                                                          not isinstance(ans, bytes) else [ans])]
        q = ex[question_key]
        rows.append({"id": f"{data_source}-{k}", "question": q.decode() if isinstance(q, bytes) else str(q),
                     "golden_answers": ans, "data_source": data_source})
    return valid_rows(rows, f"tfds {name}/{split}")


def _unique(rows: list[dict], path: str) -> list[dict]:
    seen = set()
    for r in rows:
        if r["id"] in seen:
            raise DataError(f"{path}: prompt uid {r['id']!r} occurs twice")
        seen.add(r["id"])
    return rows


def merge(*row_lists: list[dict]) -> list[dict]:
    """Concatenate datasets; uids must stay unique across them (they carry the data source)."""
    out = [r for rows in row_lists for r in rows]
    return _unique(out, "merged datasets")


READERS = {"search_r1_parquet": read_search_r1_parquet, "flashrag": read_flashrag_jsonl, "qa_json": read_qa_json,
           "spider": read_spider_json, "bird": read_bird_json, "skyrl_sql": read_skyrl_sql, "tfds": read_tfds}


def question_key(row: dict) -> tuple[str, str]:
    """What makes two rows the same question: the normalised text (SQuAD normalisation: case,
    punctuation, articles) and, for SQL, the database."""
    return row.get("db_id", ""), normalize_answer(str(row.get("question", "")))


def exclude_questions(rows: list[dict], held_out: list[dict]) -> tuple[list[dict], int]:
    """Drop every row whose question (see `question_key`) is among `held_out` (evaluation sets).
    -> (kept rows, number dropped)."""
    keys = {question_key(r) for r in held_out}
    kept = [r for r in rows if question_key(r) not in keys]
    return kept, len(rows) - len(kept)


def query_fold(row: dict, k: int, db_alias: dict | None = None) -> int:
    """Which of k folds a SQL row's gold query falls in: a stable hash of (database, the query with
    case and whitespace normalised): a split by fold never shows one gold query on both sides, and
    paraphrases of a question (Spider-Syn / Realistic / DK reuse its gold query) land together unless
    the paraphrase set corrected the query (5 of Spider-Syn's 493 training-side questions).
    `db_alias` maps a database to the one it copies (Spider-DK's `new_<db>` -> `<db>`), so a copy's
    questions hash with their originals."""
    db = row.get("db_id", "")
    db = (db_alias or {}).get(db, db)
    key = f"{db}\t{' '.join(str(row.get('query', '')).lower().split())}"
    return int.from_bytes(hashlib.sha256(key.encode()).digest()[:8], "big") % k


def drop_missing_db(rows: list[dict], path: str) -> tuple[list[dict], int]:
    """-> (the SQL rows whose database file exists, how many were dropped; logged)."""
    missing = [r for r in rows if not os.path.isfile(r["db_path"])]
    _log_skipped(path, len(missing), "their database is not under the database root",
                 missing[0]["db_path"] if missing else "")
    return [r for r in rows if os.path.isfile(r["db_path"])], len(missing)


def select_rows(rows: list[dict], spec: dict, path: str = "") -> list[dict]:
    """The row filters of a dataset entry: `db_ids` (keep the rows of these databases; the
    cross-database split, `data.spider_split`), `shuffle` (a seed: rows in a seeded random order, so
    `limit` takes a sample across the file instead of its first databases) and `query_fold` = [i, k]
    (keep the rows whose gold query hashes to fold i of k, see `query_fold`; `fold_db_alias` maps a
    copied database to its original for the hash) and `max_hardness` (keep the rows whose gold query's
    Spider hardness, `sql_hardness.hardness`, is at most this level: easy < medium < hard < extra) and
    `lab_hops` / `lab_ops` (keep the lab questions of these hops / operations)."""
    for key, field_ in (("lab_hops", "hops"), ("lab_ops", "op")):
        if spec.get(key) is not None:
            if any(not isinstance(r.get("lab"), dict) for r in rows):
                raise DataError(f"{path}: {key} selects lab questions; this file has rows without a 'lab' field")
            keep = {str(v) for v in spec[key]}
            rows = [r for r in rows if str(r["lab"][field_]) in keep]
    if spec.get("db_ids") is not None:
        keep = set(spec["db_ids"])
        rows = [r for r in rows if r.get("db_id") in keep]
    if spec.get("shuffle") is not None:
        order = random.Random(int(spec["shuffle"])).sample(range(len(rows)), len(rows))
        rows = [rows[i] for i in order]
    if spec.get("query_fold") is not None:
        fold = list(spec["query_fold"])
        if len(fold) != 2 or not 0 <= int(fold[0]) < int(fold[1]):
            raise DataError(f"{path}: query_fold={fold}; expected [i, k] with 0 <= i < k")
        if any(not r.get("query") for r in rows):
            raise DataError(f"{path}: query_fold needs SQL rows (a gold `query` per row)")
        alias = dict(spec.get("fold_db_alias") or {})
        rows = [r for r in rows if query_fold(r, int(fold[1]), alias) == int(fold[0])]
    if spec.get("max_hardness"):
        from dart_jax.data.sql_hardness import HardnessError, hardness, rank
        top = rank(str(spec["max_hardness"]))
        try:
            rows = [r for r in rows if rank(hardness(str(r.get("query") or ""))) <= top]
        except HardnessError as e:
            raise DataError(f"{path}: max_hardness needs gold queries Spider's hardness can grade: {e}") from None
    return rows


def load_rows(spec: dict, base_dir: str | None = None, require_db: bool = True) -> list[dict]:
    """One dataset from a config entry {"reader", "path", "data_source", "db_root", "limit", "offset",
    "exclude", "db_ids", "shuffle", "query_fold", "fold_db_alias", "max_hardness", "prepare"}.
    `prepare` names the launch.prepare_data setting (qa | sql) that writes `path`: a missing file
    then says how to make it. `db_ids` / `shuffle` /
    `query_fold` / `max_hardness` select rows
    (`select_rows`), as do `lab_hops` / `lab_ops` (lab questions of these cells: dart_jax/lab);
    `exclude` lists datasets (entries of the same form) whose questions are removed
    before offset / limit apply: evaluation questions never reach training (their databases need
    not be present: `require_db=False` for them)."""
    reader = spec.get("reader", "flashrag")
    if reader not in READERS:
        raise DataError(f"dataset reader {reader!r}; expected one of {sorted(READERS)}")
    if not spec.get("path") and reader != "tfds":
        raise DataError(f"dataset entry {dict(spec)} has no path: set it to the {reader} file "
                        "(e.g. --config.data.train[0].path=FILE)")
    path = spec["path"]
    if base_dir and not os.path.isabs(path) and not os.path.exists(path):
        path = os.path.join(base_dir, path)
    if spec.get("prepare") and not os.path.isfile(path):
        raise FileNotFoundError(f"dataset file {spec['path']} not found; {prepare_hint(spec['prepare'], spec['path'])}")
    kw = {"data_source": spec["data_source"]} if spec.get("data_source") else {}
    if reader in ("spider", "bird", "skyrl_sql"):
        roots = [os.path.join(base_dir, r) if base_dir and not os.path.isabs(r) and not os.path.exists(r) else r
                 for r in db_roots(spec.get("db_root"))]
        # with a database filter, rows of other (possibly absent) databases are dropped before the
        # missing-database check, so a split never warns about a database it does not use
        rows, _ = READERS[reader](path, roots, require_db=require_db and spec.get("db_ids") is None, **kw)
        if require_db and spec.get("db_ids") is not None:
            rows, _ = drop_missing_db(select_rows(rows, {"db_ids": spec["db_ids"]}, path), path)
    elif reader == "tfds":
        rows = read_tfds(spec["name"], spec.get("split", "train"), spec.get("data_source") or spec["name"],
                         spec.get("data_dir"))
    else:
        rows = READERS[reader](path, **kw)
    rows = select_rows(rows, spec, path)
    held_out = [r for ex in (spec.get("exclude") or ()) for r in load_rows(dict(ex), base_dir, require_db=False)]
    if held_out:
        rows, dropped = exclude_questions(rows, held_out)
        log.info("%s: %d rows dropped (their questions are in the excluded sets), %d left", path, dropped, len(rows))
    start = int(spec.get("offset", 0) or 0)
    limit = spec.get("limit")
    return rows[start:start + int(limit)] if limit else rows[start:]
