"""Greedy SQL evaluations scored both ways (docs/results/quickstart_sql.md): Spider EX (row order counts
when the gold query has ORDER BY — what `launch.evaluate` reports) and the GRPO training reward's
criterion (set equality of the result rows, SkyRL-SQL's frozenset comparison: `rewards.sql.training_outcome`),
each paired before/after with the exact McNemar test. Re-executes the stored solutions on the shipped
databases (read-only).

    python docs/results/quickstart_sql_rescore.py BEFORE.jsonl AFTER.jsonl [...more pairs]
"""

import json
import os
import sys

from scipy.stats import binomtest

from dart_jax.data.paths import DATA
from dart_jax.rewards.sql import execution_match
from dart_jax.run.metrics import wilson_interval


def _db(db_id: str) -> str:
    for root in ("spider/dk_database", "spider/database"):
        p = os.path.join(DATA, root, db_id, f"{db_id}.sqlite")
        if os.path.exists(p):
            return p
    raise FileNotFoundError(db_id)


def score(path: str) -> dict:
    """{question id: (spider EX, set equality)} of a per-question record file."""
    out = {}
    for line in open(path):
        r = json.loads(line)
        if not r.get("solution"):
            out[r["id"]] = (False, False)
            continue
        db = _db(r["db_id"])
        out[r["id"]] = tuple(execution_match(db, r["solution"], r["gold_sql"], sem, timeout_s=5.0)[0]
                             for sem in ("spider", "bird"))
    return out


def paired(a: dict, b: dict, k: int) -> str:
    keys = [q for q in a if q in b]
    na, nb = sum(a[q][k] for q in keys), sum(b[q][k] for q in keys)
    gain = sum(b[q][k] and not a[q][k] for q in keys)
    lost = sum(a[q][k] and not b[q][k] for q in keys)
    p = binomtest(gain, gain + lost, 0.5).pvalue if gain + lost else 1.0
    (la, ha), (lb, hb) = wilson_interval(na, len(keys)), wilson_interval(nb, len(keys))
    return (f"{na}/{len(keys)} ({la:.2f}–{ha:.2f}) -> {nb}/{len(keys)} ({lb:.2f}–{hb:.2f}), "
            f"gained {gain}, lost {lost}, McNemar p = {p:.3f}")


if __name__ == "__main__":
    args = sys.argv[1:]
    for before, after in zip(args[0::2], args[1::2]):
        a, b = score(before), score(after)
        stored = {json.loads(line)["id"]: json.loads(line)["score"] > 0 for line in open(after)}
        assert all(b[q][0] == stored[q] for q in b), "Spider EX re-scoring differs from the stored scores"
        print(f"{os.path.basename(before)} -> {os.path.basename(after)}")
        print("  Spider EX (order counts under ORDER BY):", paired(a, b, 0))
        print("  training criterion (set equality):      ", paired(a, b, 1))
