"""Greedy SQL evaluations scored both ways (docs/results/quickstart_sql.md): Spider EX (row order counts
when the gold query has ORDER BY — what `launch.evaluate` reports) and the GRPO training reward's
criterion in both of its forms (`rewards.sql.sql_training_reward` on the whole response: SkyRL-SQL's
format check, then the result rows compared by `reward.sql_match`: `set`, SkyRL's frozenset
comparison, the default, or `spider`, Spider EX's), and Spider EX with DISTINCT deleted from both
queries (test-suite-sql-eval's default, `launch.evaluate --nokeep-distinct`), each paired before/after
with the exact McNemar test and, because paraphrased questions share a gold query (the 70 training
questions are 38 distinct gold queries, the 56 held-out ones 28), with the sign-flip test over gold-query
clusters (methods_report.clustered_paired). Re-executes the stored solutions on the shipped
databases (read-only).

    python docs/results/quickstart_sql_rescore.py BEFORE.jsonl AFTER.jsonl [...more pairs]
"""

import json
import os
import sys

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", ".."))  # the repo root

from dart_jax.data.paths import DATA  # noqa: E402
from dart_jax.data.readers import _db_path  # noqa: E402
from dart_jax.experiments.methods_report import clustered_paired, paired  # noqa: E402
from dart_jax.rewards.sql import execution_match, sql_training_reward  # noqa: E402
from dart_jax.run.metrics import wilson_interval  # noqa: E402


def score(path: str) -> dict:
    """{question id: (Spider EX, the set-match training reward is +1, the spider-match one is +1, Spider EX
    without DISTINCT)} of a per-question record file: EX of the final solution as `launch.evaluate` scores it,
    the training reward itself on the whole response (SkyRL's format check, then the row comparison; an empty
    gold result never matches), and EX as test-suite scores it by default."""
    roots = [os.path.join(DATA, "spider", "dk_database"), os.path.join(DATA, "spider", "database")]
    out = {}
    for line in open(path):
        r = json.loads(line)
        db = _db_path(roots, r["db_id"])
        ex = bool(r.get("solution")) and execution_match(db, r["solution"], r["gold_sql"], "spider", timeout_s=5.0)[0]
        ex_nd = bool(r.get("solution")) and execution_match(db, r["solution"], r["gold_sql"], "spider", timeout_s=5.0,
                                                             keep_distinct=False)[0]
        out[r["id"]] = (ex, *(sql_training_reward(r["response"], db, r["gold_sql"], timeout_s=5.0, match=m) > 0
                              for m in ("set", "spider")), ex_nd)
    return out


def clusters(path: str) -> dict:
    """{("q", question id): (database, gold query lower-cased, whitespace collapsed)}."""
    rows = [json.loads(line) for line in open(path)]
    return {("q", r["id"]): (r["db_id"], " ".join(r["gold_sql"].lower().split())) for r in rows}


def compare(a: dict, b: dict, k: int, cluster: dict) -> str:
    """Criterion k (0 Spider EX, 1 training reward with set match, 2 with spider match, 3 Spider EX without
    DISTINCT) paired
    before/after (methods_report.paired: exact McNemar)."""
    pa, pb = ({("q", q): v[k] for q, v in d.items()} for d in (a, b))
    r, c = paired(pa, pb, "q"), clustered_paired(pa, pb, "q", cluster)
    na, nb, n = r["only_a"] + r["both"], r["only_b"] + r["both"], r["n"]
    (la, ha), (lb, hb) = wilson_interval(na, n), wilson_interval(nb, n)
    return (f"{na}/{n} ({la:.2f}–{ha:.2f}) -> {nb}/{n} ({lb:.2f}–{hb:.2f}), "
            f"gained {r['only_b']}, lost {r['only_a']}, McNemar p = {r['p']:.3f}; by gold query: {c['moved']} of "
            f"{c['clusters']} moved, net {c['net']:+d}, sign-flip p = {c['p']:.3f}")


if __name__ == "__main__":
    args = sys.argv[1:]
    for before, after in zip(args[0::2], args[1::2]):
        a, b, cl = score(before), score(after), clusters(after)
        stored = {json.loads(line)["id"]: json.loads(line)["score"] > 0 for line in open(after)}
        assert all(b[q][0] == stored[q] for q in b), "Spider EX re-scoring differs from the stored scores"
        print(f"{os.path.basename(before)} -> {os.path.basename(after)}")
        print("  Spider EX (order counts under ORDER BY):", compare(a, b, 0, cl))
        print("  training reward, sql_match=set (format + set equality):", compare(a, b, 1, cl))
        print("  training reward, sql_match=spider (format + Spider EX):", compare(a, b, 2, cl))
        print("  Spider EX, DISTINCT deleted from both (test-suite's default):", compare(a, b, 3, cl))
