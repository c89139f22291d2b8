"""SQL rewards: SkyRL-SQL's training reward and execution accuracy (EX) in two semantics.

Spider family (test-suite-sql-eval `result_eq`): same row count and column count; rows compared
as multisets, in order only when the gold SQL has ORDER BY; a permutation of the predicted
columns may match the gold columns. Python equality, so 1 == 1.0.
BIRD: set(pred rows) == set(gold rows), column order significant; any error scores 0.
"""

from __future__ import annotations

import itertools
import re
from collections import Counter

from dart_jax.tools.sqlite_exec import execute

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


def execution_match(db_path: str, pred_sql: str, gold_sql: str, semantics: str = "spider",
                    timeout_s: float = 30.0, max_rows: int = 100_000) -> tuple[bool, dict]:
    """-> (EX, details). Errors in the prediction score 0; an error in the gold query raises."""
    gold = execute(db_path, gold_sql, timeout_s, max_rows)
    if not gold.ok:
        raise ValueError(f"gold SQL fails on {db_path}: {gold.error}: {gold_sql}")
    pred = execute(db_path, pred_sql, timeout_s, max_rows)
    if not pred.ok:
        return False, {"error": pred.error}
    if pred.truncated or gold.truncated:
        return False, {"error": f"result exceeds {max_rows} rows"}
    if semantics == "spider":
        ok = spider_result_eq(pred.rows, gold.rows, bool(_ORDER_BY.search(gold_sql)))
    elif semantics == "bird":
        ok = bird_result_eq(pred.rows, gold.rows)
    else:
        raise ValueError(f"semantics={semantics!r}; expected 'spider' or 'bird'")
    return ok, {"pred_rows": len(pred.rows), "gold_rows": len(gold.rows)}


_SOLUTION = re.compile(r"<solution>(.*?)</solution>", re.DOTALL)
_THINK = re.compile(r"<think>.*?</think>", re.DOTALL)


def sql_format_ok(response: str) -> bool:
    """SkyRL-SQL's format check: exactly one <solution>…</solution>, at least one <think> block,
    and a <think> block after every </observation>."""
    if len(_SOLUTION.findall(response)) != 1 or not _THINK.search(response):
        return False
    parts = response.split("</observation>")
    return all(_THINK.search(after) for after in parts[1:])


def extract_solution(response: str) -> str | None:
    found = _SOLUTION.findall(response)
    return found[-1].strip() if found else None


def sql_training_reward(response: str, db_path: str, gold_sql: str, timeout_s: float = 30.0) -> float:
    """+1 if the format is valid and the solution's result set equals the gold's, else −1."""
    if not sql_format_ok(response):
        return -1.0
    ok, _ = execution_match(db_path, extract_solution(response) or "", gold_sql, "bird", timeout_s)
    return 1.0 if ok else -1.0


