"""The public training files of the paper's two settings, checked and turned into what the paper
configs read, so that a run never starts on a file it cannot use or on an evaluation question.

qa:  Search-R1's merged NQ + HotpotQA training set (Hugging Face dataset PeterJinGo/nq_hotpotqa_train,
     `train.parquet`, written by Search-R1's scripts/data_process/qa_search_train_merge.py)
     -> OUT/train.parquet, which configs/paper_qa.py reads from data/nq_hotpotqa_train.
sql: SkyRL-SQL-653 (NovaSky-AI/SkyRL-SQL-653-data-newfmt, `train.parquet`) with OmniSQL's databases
     (the db root: OmniSQL's data/ folder, holding SynSQL-2.5M/databases, spider/database and
     bird/train/train_databases) -> OUT/train.parquet whose rows carry their database's absolute
     path in a `db_path` column, which configs/paper_sql.py reads from data/skyrl_sql with no
     database flag.

Kept rows are the input's rows unchanged and in input order, every published column kept (the file
stays usable by Search-R1 / SkyRL). Rows are parsed by the readers the configs use
(`readers.search_r1_row`, `readers.skyrl_sql_row`), so what is kept is exactly what training reads.
A row is dropped, and counted by reason in OUT/prepare_report.json, when a field is missing or its
answers are empty, when it asks a question of a shipped evaluation set (every set of
`eval.datasets.exclusion_specs`, compared as `readers.question_key`), when its uid or its question
repeats an earlier kept row, and (sql) when its database file is missing or is not SQLite.
"""

from __future__ import annotations

import hashlib
import json
import os
from collections import Counter
from typing import Any, Callable, Iterator

from dart_jax.data.paths import REPO
from dart_jax.data.readers import SKYRL_DB_FOLDERS, DataError, load_rows, question_key, search_r1_row, skyrl_sql_row
from dart_jax.data.settings import SETTINGS, Setting, setting_of
from dart_jax.data.text import normalize_answer
from dart_jax.errors import UserError

TRAIN = "train.parquet"
REPORT = "prepare_report.json"
EXAMPLES = 3  # rows quoted per drop reason in the report


# ---------------------------------------------------------------------------------------------------
# the published schemas


def _is_str(t) -> bool:
    import pyarrow as pa
    return pa.types.is_string(t) or pa.types.is_large_string(t)


def _is_list(t, item: Callable) -> bool:
    import pyarrow as pa
    return (pa.types.is_list(t) or pa.types.is_large_list(t)) and item(t.value_type)


def _field(t, name: str):
    """The type of struct field `name` of `t`, None when `t` is no struct or has no such field."""
    import pyarrow as pa
    if not pa.types.is_struct(t) or t.get_field_index(name) < 0:
        return None
    return t.field(name).type


def _is_messages(t) -> bool:
    """Chat messages: list<struct<content: string, role: string, …>>."""
    return _is_list(t, lambda m: _field(m, "content") is not None and _is_str(_field(m, "content"))
                    and _field(m, "role") is not None and _is_str(_field(m, "role")))


def _is_id(t) -> bool:
    import pyarrow as pa
    return _is_str(t) or pa.types.is_integer(t)


def _is_answers(t) -> bool:
    return _is_str(t) or _is_list(t, _is_str)


def _is_qa_ground_truth(t) -> bool:
    """Search-R1's reward_model: struct<style, ground_truth: struct<target: list<string>>>."""
    gt = _field(t, "ground_truth")
    target = _field(gt, "target") if gt is not None else None
    return gt is not None and (_is_answers(gt) or (target is not None and _is_answers(target)))


def _is_sql_ground_truth(t) -> bool:
    """SkyRL's reward_spec (newfmt) / reward_model (verl format): struct<…, ground_truth: string>."""
    gt = _field(t, "ground_truth")
    return gt is not None and _is_str(gt)


# column -> (check, the published type in words); a setting needs one column of each group
_QA_COLUMNS = {
    "data_source": (_is_str, "string"),
    "question": (_is_str, "string"),
    "prompt": (_is_messages, "list<struct<role: string, content: string>>"),
    "golden_answers": (_is_answers, "list<string>"),
    "reward_model": (_is_qa_ground_truth, "struct<style: string, ground_truth: struct<target: list<string>>>"),
    "id": (_is_id, "string"),
    "extra_info": (lambda t: _field(t, "index") is not None, "struct<split: string, index: int64>"),
}
_QA_NEEDS = (("data_source",), ("question", "prompt"), ("golden_answers", "reward_model"))
_SQL_COLUMNS = {
    "db_id": (_is_str, "string"),
    "data": (_is_str, f"string, one of {sorted(SKYRL_DB_FOLDERS)}"),
    "question": (_is_str, "string"),
    "prompt": (_is_messages, "list<struct<role: string, content: string>>"),
    "reward_spec": (_is_sql_ground_truth, "struct<method: string, ground_truth: string>"),
    "reward_model": (_is_sql_ground_truth, "struct<style: string, ground_truth: string>"),
    "sql": (_is_str, "string"),
}
_SQL_NEEDS = (("db_id",), ("question", "prompt"), ("reward_spec", "reward_model", "sql"))


def _open(path: str, setting: Setting):
    """The input as a pyarrow ParquetFile whose schema has the published columns and types; any
    problem is one error naming the file, the column, what it is and what it should be."""
    import pyarrow.parquet as pq
    if not os.path.isfile(path):
        get = setting.download.replace("DIR", os.path.dirname(os.path.abspath(path)))
        raise FileNotFoundError(f"input file {path} not found; get {setting.what} with: {get}")
    try:
        pf = pq.ParquetFile(path)
    except Exception as e:  # pyarrow raises ArrowInvalid / OSError variants for a non-parquet file
        raise UserError(f"{path} is not a parquet file ({e}); --input is the train.parquet of "
                        f"{setting.what}") from None
    schema = pf.schema_arrow
    names = set(schema.names)
    columns, needs = (_QA_COLUMNS, _QA_NEEDS) if setting.name == "qa" else (_SQL_COLUMNS, _SQL_NEEDS)
    if setting.name == "qa" and "db_id" in names:
        raise UserError(f"{path} has a 'db_id' column: it is a SQL training file; prepare it with "
                        "`python -m launch.prepare_data sql --db-root=DIR`")
    if setting.name == "sql" and "db_id" not in names and ("golden_answers" in names or "reward_model" in names):
        raise UserError(f"{path} has no 'db_id' column but QA answers: it is a QA training file; prepare it "
                        "with `python -m launch.prepare_data qa`")
    problems = [f"no column {' or '.join(map(repr, group))}" for group in needs if not names & set(group)]
    for name, (ok, expected) in columns.items():
        if name in names and not ok(schema.field(name).type):
            problems.append(f"column {name!r} is {schema.field(name).type}, expected {expected}")
    if problems:
        raise UserError(f"{path}: {'; '.join(problems)} (columns: {', '.join(schema.names)}); --input is the "
                        f"train.parquet of {setting.what} ({setting.download})")
    return pf


def _rows(pf, columns: list[str], batch: int = 8192) -> Iterator[tuple[int, dict]]:
    """(row index, row as a dict of `columns`), a batch at a time: the unread columns (HotpotQA's
    metadata) never become Python objects."""
    k = 0
    for b in pf.iter_batches(batch_size=batch, columns=columns):
        for r in b.to_pylist():
            yield k, r
            k += 1


def _sha256(path: str) -> str:
    with open(path, "rb") as f:
        return hashlib.file_digest(f, "sha256").hexdigest()


# ---------------------------------------------------------------------------------------------------
# row selection


def evaluation_questions(held_out: list[dict]) -> dict[tuple[str, str], str]:
    """question_key -> the evaluation set that asks it (the first, in `held_out` order). `held_out`:
    reader specs of the evaluation sets (`dart_jax.eval.datasets.exclusion_specs(task)`, which the
    caller passes in: evaluation sits above data in the package layers)."""
    out: dict[tuple[str, str], str] = {}
    for spec in held_out:
        for r in load_rows(dict(spec), require_db=False):
            out.setdefault(question_key(r), spec["data_source"])
    return out


class _Tally:
    """Rows read / kept per source, rows dropped per reason (with a few examples), evaluation
    questions per set."""

    def __init__(self):
        self.read, self.kept, self.dropped, self.excluded = Counter(), Counter(), Counter(), Counter()
        self.examples: dict[str, list[str]] = {}

    def drop(self, reason: str, k: int, source: str, detail: str) -> None:
        self.dropped[reason] += 1
        ex = self.examples.setdefault(reason, [])
        if len(ex) < EXAMPLES:
            ex.append(f"row {k} ({source}): {detail}")

    def report(self, **head: Any) -> dict:
        return dict(head, rows_read=sum(self.read.values()), rows_kept=sum(self.kept.values()),
                    by_source={s: {"read": self.read[s], "kept": self.kept[s]} for s in sorted(self.read)},
                    dropped=dict(sorted(self.dropped.items())), excluded_by_set=dict(sorted(self.excluded.items())),
                    examples=dict(sorted(self.examples.items())))


def _select(pf, columns: list[str], parse: Callable[[dict, int], dict], source_of: Callable[[dict], str],
            held_out: list[dict], extra_checks: Callable[[dict], tuple[str, str] | None] = lambda row: None,
            unique_ids: bool = True) -> tuple[list[int], list[dict], _Tally]:
    """-> (kept row indices, their parsed rows, the tally). Checks in order: the reader parses the
    row, its question is not blank, it is no evaluation question, `extra_checks` (the database),
    its uid and its question are new."""
    held = evaluation_questions(held_out)
    tally, kept, parsed, uids, keys = _Tally(), [], [], set(), set()
    for k, r in _rows(pf, columns):
        source = source_of(r) or "(none)"
        tally.read[source] += 1
        try:
            row = parse(r, k)
        except DataError as e:
            tally.drop(e.reason, k, source, str(e).split(": ", 1)[-1].removeprefix(f"row {k} "))
            continue
        key = question_key(row)
        if not key[1]:
            tally.drop("empty question", k, source, repr(row["question"]))
            continue
        if key in held:
            tally.drop("evaluation question", k, source, f"{row['question']!r} is in {held[key]}")
            tally.excluded[held[key]] += 1
            continue
        problem = extra_checks(row)
        if problem:
            tally.drop(problem[0], k, source, problem[1])
        elif unique_ids and row["id"] in uids:
            tally.drop("duplicate uid", k, source, f"uid {row['id']!r} repeats an earlier row")
        elif key in keys:
            tally.drop("duplicate question", k, source, f"{row['question']!r} repeats an earlier row")
        else:
            uids.add(row["id"])
            keys.add(key)
            kept.append(k)
            parsed.append(row)
            tally.kept[source] += 1
    return kept, parsed, tally


def prepare_qa(input_path: str, held_out: list[dict]) -> tuple[Any, dict]:
    """Search-R1's train.parquet -> (the kept rows as a pyarrow Table, the report)."""
    setting = SETTINGS["qa"]
    pf = _open(input_path, setting)
    columns = [c for c in _QA_COLUMNS if c in pf.schema_arrow.names]

    def answers_blank(row: dict) -> tuple[str, str] | None:
        # every answer normalises to "": only an empty <answer></answer> would match
        if not any(normalize_answer(a) for a in row["golden_answers"]):
            return "empty answers", f"answers {row['golden_answers']!r} are blank"
        return None

    kept, _, tally = _select(pf, columns, lambda r, k: search_r1_row(r, input_path, k),
                             lambda r: r.get("data_source"), held_out, answers_blank)
    table = pf.read().take(kept)
    return table, tally.report(setting="qa", input=os.path.abspath(input_path), input_sha256=_sha256(input_path))


def _sqlite_problem(row: dict) -> tuple[str, str] | None:
    path = row["db_path"]
    if not os.path.isfile(path):
        return "database missing", f"{path} not found"
    with open(path, "rb") as f:
        if f.read(16) != b"SQLite format 3\x00":
            return "database not SQLite", f"{path} is not an SQLite file"
    return None


def prepare_sql(input_path: str, db_root: str, held_out: list[dict]) -> tuple[Any, dict]:
    """SkyRL-SQL-653's train.parquet + OmniSQL's data/ folder -> (the kept rows as a pyarrow Table
    with an absolute `db_path` column, the report)."""
    import pyarrow as pa
    setting = SETTINGS["sql"]
    if not db_root:
        raise UserError(f"sql needs --db-root=DB/data, OmniSQL's data/ folder (get it with: {setting.databases})")
    if not os.path.isdir(db_root):
        raise FileNotFoundError(f"database root {db_root} not found; it is OmniSQL's data/ folder, holding "
                                f"{', '.join(sorted(SKYRL_DB_FOLDERS.values()))} (get it with: {setting.databases})")
    pf = _open(input_path, setting)
    root = os.path.abspath(db_root)
    names = pf.schema_arrow.names
    columns = [c for c in _SQL_COLUMNS if c in names]

    def parse(r: dict, k: int) -> dict:  # the database under --db-root, never a db_path the input carries
        row = skyrl_sql_row(r, input_path, k, [root])
        return dict(row, db_path=os.path.abspath(row["db_path"]))

    kept, parsed, tally = _select(pf, columns, parse, lambda r: r.get("data"), held_out, _sqlite_problem,
                                  unique_ids=False)
    if not kept and tally.dropped["database missing"]:
        raise UserError(f"no database of {input_path} is under {db_root}: all {tally.dropped['database missing']} "
                        f"rows checked miss theirs (e.g. {tally.examples['database missing'][0]}); --db-root is "
                        f"OmniSQL's data/ folder, holding {', '.join(sorted(SKYRL_DB_FOLDERS.values()))}")
    table = pf.read().take(kept)
    paths = pa.array([r["db_path"] for r in parsed], pa.string())
    if "db_path" in names:
        table = table.set_column(names.index("db_path"), "db_path", paths)
    else:
        table = table.append_column("db_path", paths)
    return table, tally.report(setting="sql", input=os.path.abspath(input_path), input_sha256=_sha256(input_path),
                               db_root=root)


# ---------------------------------------------------------------------------------------------------
# writing


def write(out_dir: str, table, report: dict, overwrite: bool = False) -> str:
    """OUT/train.parquet + OUT/prepare_report.json -> "written" or "unchanged" (the same rows are
    already there). A different train.parquet already in OUT is kept unless `overwrite`."""
    import pyarrow as pa
    import pyarrow.parquet as pq
    if os.path.exists(out_dir) and not os.path.isdir(out_dir):
        raise UserError(f"--out={out_dir} is a file; give a folder")
    buf = pa.BufferOutputStream()
    pq.write_table(table, buf)
    data = buf.getvalue().to_pybytes()
    target = os.path.join(out_dir, TRAIN)
    same = False
    if os.path.exists(target):
        same = os.path.getsize(target) == len(data) and open(target, "rb").read() == data
        if not same and not overwrite:
            raise UserError(f"{target} already holds different rows{_made_from(out_dir)}; pass --overwrite to "
                            "replace it, or choose another --out")
    os.makedirs(out_dir, exist_ok=True)
    if not same:
        _atomic_write(target, data)
    _atomic_write(os.path.join(out_dir, REPORT), (json.dumps(report, indent=1, sort_keys=True) + "\n").encode())
    return "unchanged" if same else "written"


def _made_from(out_dir: str) -> str:
    try:
        with open(os.path.join(out_dir, REPORT)) as f:
            return f" (prepared from {json.load(f)['input']})"
    except (OSError, ValueError, KeyError):
        return ""


def _atomic_write(path: str, data: bytes) -> None:
    tmp = f"{path}.tmp{os.getpid()}"
    with open(tmp, "wb") as f:
        f.write(data)
    os.replace(tmp, path)


def prepare(setting: str, input_path: str, held_out: list[dict], out_dir: str = "", db_root: str = "",
            overwrite: bool = False) -> tuple[dict, str]:
    """Validate, select and write one setting's training file -> (report, "written" | "unchanged").
    `held_out`: reader specs of the evaluation sets whose questions never train
    (`dart_jax.eval.datasets.exclusion_specs(setting)`); `out_dir` defaults to where the setting's
    paper config reads."""
    s = setting_of(setting)
    if s.name == "qa":
        if db_root:
            raise UserError("--db-root is for the sql setting; qa has no databases")
        table, report = prepare_qa(input_path, held_out)
    else:
        table, report = prepare_sql(input_path, db_root, held_out)
    out_dir = out_dir or os.path.join(REPO, s.out)  # where the paper config reads, wherever this runs from
    report["output"] = os.path.join(os.path.abspath(out_dir), TRAIN)
    return report, write(out_dir, table, report, overwrite)


def format_report(report: dict, status: str) -> str:
    """The report as a short table: rows per source, drops per reason, what was written."""
    lines = [f"{report['setting']}: {report['rows_read']} rows read from {report['input']}",
             f"  {'source':<16}{'read':>9}{'kept':>9}"]
    lines += [f"  {s:<16}{c['read']:>9}{c['kept']:>9}" for s, c in report["by_source"].items()]
    lines.append(f"  {'total':<16}{report['rows_read']:>9}{report['rows_kept']:>9}")
    if report["dropped"]:
        lines.append("  dropped:")
        for reason, n in sorted(report["dropped"].items(), key=lambda kv: -kv[1]):
            sets = (" (" + ", ".join(f"{s} {c}" for s, c in report["excluded_by_set"].items()) + ")"
                    if reason == "evaluation question" else "")
            lines.append(f"    {reason:<22}{n:>7}{sets}")
    verb = "wrote" if status == "written" else "unchanged:"
    lines.append(f"{verb} {report['output']} ({report['rows_kept']} rows) and its {REPORT}")
    return "\n".join(lines)
