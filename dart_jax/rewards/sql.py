"""SQL rewards: SkyRL-SQL's training reward and execution accuracy (EX) in two semantics.

Spider family (test-suite-sql-eval `result_eq`): same row count and column count; rows compared
as multisets, in order only when the gold SQL has ORDER BY; a permutation of the predicted
columns may match the gold columns. Python equality, so 1 == 1.0. test-suite's `eval_exec_match` by
default (`--keep_distinct` off) also deletes every DISTINCT keyword from both queries before running
them: `keep_distinct=False` here does the same (`remove_distinct`, on sqlglot's SQLite tokens, so a
quoted 'distinct' stays); the default `keep_distinct=True` runs both queries as written, so `SELECT
DISTINCT x` against a gold `SELECT x` with repeated values scores 0 (87 of 1,034 Spider dev gold
queries contain DISTINCT).
BIRD: set(pred rows) == set(gold rows), column order significant; any error scores 0.
"""

from __future__ import annotations

import itertools
import re
from collections import Counter

from dart_jax.tools.sqlite_exec import MAX_RESULT_BYTES, execute

_ORDER_BY = re.compile(r"\border\s+by\b", re.IGNORECASE)


def _permutations(pred_cols: int, pred: list[tuple], gold: list[tuple]):
    """Column permutations of pred worth trying: only those where each column's value multiset
    equals the target gold column's (test-suite's pruning), so wide results stay cheap."""
    gold_sigs = [Counter(r[j] for r in gold) for j in range(pred_cols)]
    pred_sigs = [Counter(r[i] for r in pred) for i in range(pred_cols)]
    candidates = [[i for i in range(pred_cols) if pred_sigs[i] == gold_sigs[j]] for j in range(pred_cols)]
    if any(not c for c in candidates):
        return
    for perm in itertools.product(*candidates):
        if len(set(perm)) == pred_cols:
            yield perm


def spider_result_eq(pred: list[tuple], gold: list[tuple], order_matters: bool) -> bool:
    if len(pred) != len(gold):
        return False
    if not pred:
        return True
    if len(pred[0]) != len(gold[0]):
        return False
    for perm in _permutations(len(pred[0]), pred, gold):
        permuted = [tuple(r[i] for i in perm) for r in pred]
        if order_matters:
            if permuted == list(gold):
                return True
        elif Counter(permuted) == Counter(gold):
            return True
    return False


def bird_result_eq(pred: list[tuple], gold: list[tuple]) -> bool:
    return set(pred) == set(gold)


def remove_distinct(sql: str) -> str:
    """`sql` without its DISTINCT keywords, as test-suite-sql-eval's `remove_distinct`: every one, COUNT(DISTINCT x)
    and DISTINCT(x) included, quoted text and comments kept, the text around them as written; and, as theirs
    (`sqlparse.parse(s)[0]`), only the first statement. SQL the SQLite tokenizer cannot read comes back unchanged."""
    import sqlglot
    from sqlglot.errors import SqlglotError
    from sqlglot.tokens import TokenType
    try:
        tokens = sqlglot.tokenize(sql, read="sqlite")
    except SqlglotError:
        return sql
    out, at, stop = [], 0, len(sql)
    for t in tokens:  # Token.end is inclusive
        if t.token_type == TokenType.SEMICOLON:
            stop = t.end + 1
            break
        if t.token_type == TokenType.DISTINCT:
            out.append(sql[at:t.start])
            at = t.end + 1
    return "".join(out) + sql[at:stop]


def execution_match(db_path: str, pred_sql: str, gold_sql: str, semantics: str = "spider",
                    timeout_s: float = 30.0, max_rows: int = 100_000, keep_distinct: bool = True) -> tuple[bool, dict]:
    """-> (EX, details). Errors in the prediction score 0; an error in the gold query raises.
    `keep_distinct=False` (Spider semantics only): both queries run through `remove_distinct`, as test-suite's
    default. Not ported from test-suite (either setting): its rewrite of `> =` / `< =` / `! =` and its value for
    YEAR(CURDATE()); a query is run as given."""
    if semantics not in ("spider", "bird"):
        raise ValueError(f"semantics={semantics!r}; expected 'spider' or 'bird'")
    pred_run, gold_run = pred_sql, gold_sql
    if not keep_distinct:
        if semantics != "spider":
            raise ValueError("keep_distinct=False is test-suite-sql-eval's (Spider) convention; BIRD runs queries "
                             "as written")
        pred_run, gold_run = remove_distinct(pred_sql), remove_distinct(gold_sql)
    gold = execute(db_path, gold_run, timeout_s, max_rows)
    if not gold.ok:
        ran = "" if gold_run == gold_sql else f" (run as {gold_run!r})"
        raise ValueError(f"gold SQL fails on {db_path}: {gold.error}: {gold_sql}{ran}")
    pred = execute(db_path, pred_run, timeout_s, max_rows)
    if not pred.ok:
        return False, {"error": pred.error}
    if pred.truncated or gold.truncated:
        return False, {"error": f"result exceeds {max_rows} rows or {MAX_RESULT_BYTES} bytes"}
    ok = rows_match(pred.rows, gold.rows, gold_run, "spider" if semantics == "spider" else "set")
    return ok, {"pred_rows": len(pred.rows), "gold_rows": len(gold.rows)}


SOLUTION_START, SOLUTION_END, THINK_START = "<solution>", "</solution>", "<think>"
_SOLUTION = re.compile(r"<solution>(.*?)</solution>", re.DOTALL)
_THOUGHTS = re.compile(r"<think>(.*?)</think>", re.DOTALL)
_FORBIDDEN_IN_SOLUTION = re.compile(r"</?(think|sql|observation)\b", re.IGNORECASE)
_OBSERVATION_END = re.compile(r"</observation>", re.IGNORECASE)


def verify_format_and_extract(output: str) -> tuple[bool, list[str] | None, str | None]:
    """SkyRL-SQL's training format check (skyrl-gym `envs/sql/utils.py`
    `verify_format_and_extract`, same rules in the same order) -> (valid, thoughts, solution):
    exactly one `<solution>` and, after it, exactly one `</solution>`; no think / sql / observation
    tag inside the solution; at least one `<think>…</think>`; before the solution, every
    `</observation>` followed (after whitespace only) by `<think>`."""
    if output.count(SOLUTION_START) != 1:
        return False, None, None
    pre_solution, tail = output.split(SOLUTION_START, 1)
    if tail.count(SOLUTION_END) != 1:
        return False, None, None
    solution_text = tail.split(SOLUTION_END, 1)[0]
    if _FORBIDDEN_IN_SOLUTION.search(solution_text):
        return False, None, None
    thoughts = _THOUGHTS.findall(output)
    if not thoughts:
        return False, None, None
    for m in _OBSERVATION_END.finditer(pre_solution):
        if not pre_solution[m.end():].lstrip().lower().startswith(THINK_START):
            return False, None, None
    return True, thoughts, solution_text.strip()


def sql_format_ok(response: str) -> bool:
    return verify_format_and_extract(response)[0]


def extract_solution(response: str) -> str | None:
    """The last <solution>…</solution> (evaluation: EX scores what the model finally answered)."""
    found = _SOLUTION.findall(response)
    return found[-1].strip() if found else None


SHAPINGS = {  # reward of (execution match, wrong or failing prediction, format failure)
    "paper": (1.0, -1.0, -1.0),   # the paper's NL2SQL reward: +1 if the final SQL's result matches, else −1
    "skyrl": (1.0, 0.0, -1.0),    # SkyRL's calculate_reward_single
}


def shaped_reward(outcome: str, shaping: str = "paper") -> float:
    """outcome: 'match' | 'wrong' | 'format' -> the shaping's reward."""
    if shaping not in SHAPINGS:
        raise ValueError(f"SQL reward shaping {shaping!r}; expected one of {sorted(SHAPINGS)}")
    return SHAPINGS[shaping][("match", "wrong", "format").index(outcome)]


# how the training reward compares result rows: "set" is SkyRL-SQL's frozenset comparison (row order
# and duplicates ignored, column order significant; the default, for cross-checks against SkyRL);
# "spider" is Spider's EX (`spider_result_eq`: multisets, in order when the gold SQL has ORDER BY,
# columns may be permuted), so a policy is rewarded for what the held-out EX check counts
SQL_MATCHES = ("set", "spider")


def _check_match(match: str) -> None:
    if match not in SQL_MATCHES:
        raise ValueError(f"SQL reward match {match!r}; expected one of {SQL_MATCHES}")


def rows_match(pred_rows: list[tuple], gold_rows: list[tuple], gold_sql: str, match: str = "set") -> bool:
    """Result rows compared under `match` (SQL_MATCHES; `set` is also BIRD's EX, `spider` Spider's EX,
    which reads ORDER BY from `gold_sql`)."""
    _check_match(match)
    if match == "set":
        return bird_result_eq(pred_rows, gold_rows)
    return spider_result_eq(pred_rows, gold_rows, bool(_ORDER_BY.search(gold_sql)))


def training_outcome(format_ok: bool, pred_rows_or_error, gold_rows: list[tuple], reward_empty_gold: bool = False,
                     match: str = "set", gold_sql: str = "") -> str:
    """'format' (SkyRL's check failed), 'match' (the result rows equal the gold query's under `match`:
    "set", SkyRL's frozenset comparison, or "spider", Spider EX's ordered-under-ORDER-BY multiset
    comparison, which reads ORDER BY from `gold_sql`) or 'wrong' (also a prediction that failed:
    `pred_rows_or_error` a string). An empty gold result matches nothing unless `reward_empty_gold`
    (SkyRL issue 2451: any query returning no rows would otherwise earn the full reward)."""
    _check_match(match)
    if match == "spider" and not gold_sql:
        raise ValueError("match='spider' needs the gold SQL (its ORDER BY decides whether row order counts)")
    if not format_ok:
        return "format"
    if isinstance(pred_rows_or_error, str):
        return "wrong"
    if not gold_rows and not reward_empty_gold:
        return "wrong"
    return "match" if rows_match(pred_rows_or_error, gold_rows, gold_sql, match) else "wrong"


def sql_training_reward(response: str, db_path: str, gold_sql: str, timeout_s: float = 30.0, shaping: str = "paper",
                        reward_empty_gold: bool = False, max_rows: int = 100_000, match: str = "set") -> float:
    """One response's training reward (the batch form with the gold cache and thread pool is
    `rewards.training.SQLReward`). A failing gold query raises."""
    _check_match(match)
    gold = execute(db_path, gold_sql, timeout_s, max_rows)
    if not gold.ok or gold.truncated:
        raise ValueError(f"gold SQL fails on {db_path}: {gold.error or 'too many rows'}: {gold_sql}")
    ok, _, solution = verify_format_and_extract(response)
    pred = execute(db_path, solution or "", timeout_s, max_rows) if ok else None
    rows = pred.rows if pred is not None and pred.ok and not pred.truncated else "error"
    return shaped_reward(training_outcome(ok, rows, gold.rows, reward_empty_gold, match, gold_sql), shaping)
