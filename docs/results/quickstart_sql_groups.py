"""Per-step GRPO signal of a SQL run (docs/results/quickstart_sql.md): execution matches, groups with
mixed outcomes (the only groups whose group-normalised advantages are non-zero), answers; the same
in blocks of steps; and the gold queries (by exact query string) drawn at more than one step, first draw vs last.

    python docs/results/quickstart_sql_groups.py [runs/quickstart_sql/rollouts.jsonl[.gz]] [--block 8]
"""

import argparse
import collections
import gzip
import json


def load(path: str) -> dict:
    groups = collections.defaultdict(list)
    with (gzip.open(path, "rt") if path.endswith(".gz") else open(path)) as f:
        for line in f:
            r = json.loads(line)
            groups[(r["step"], r["uid"])].append(r)  # uid: the prompt, shared by its group
    return groups


def _counts(gs: list[list[dict]]) -> collections.Counter:
    c = collections.Counter(groups=len(gs), n=sum(len(g) for g in gs))
    c.update(match=sum(t["score"] > 0 for g in gs for t in g),
             mixed=sum(0 < sum(t["score"] > 0 for t in g) < len(g) for g in gs),
             answered=sum(t["finish"] == "answer" for g in gs for t in g))
    return c


def table(groups: dict, block: int = 1) -> str:
    steps = sorted({s for s, _ in groups})
    head = "step" if block == 1 else "steps"
    out = [f"| {head} | execution matches | groups with mixed outcomes | trajectories ending in `<solution>` |",
           "|---|---|---|---|"]
    total = collections.Counter()
    for i in range(0, len(steps), block):
        chunk = steps[i:i + block]
        c = _counts([g for (st, _), g in groups.items() if st in chunk])
        total.update(c)
        label = str(chunk[0]) if len(chunk) == 1 else f"{chunk[0]}–{chunk[-1]}"
        out.append(f"| {label} | {c['match']} / {c['n']} | {c['mixed']} / {c['groups']} | {c['answered']} / {c['n']} |")
    out.append(f"| all | {total['match']} / {total['n']} | {total['mixed']} / {total['groups']} | "
               f"{total['answered']} / {total['n']} |")
    return "\n".join(out)


def repeated_queries(groups: dict) -> tuple[int, int, int, int]:
    """Gold queries (by exact string) drawn at more than one step, in the same or another phrasing: (queries, samples at the first
    draw, right at the first draw, right at the last draw)."""
    draws = collections.defaultdict(list)  # (db, gold query) -> [(step, right, n)]
    for (step, _), g in groups.items():
        draws[(g[0]["db_id"], g[0]["query"])].append((step, sum(t["score"] > 0 for t in g), len(g)))
    rep = [sorted(v) for v in draws.values() if len({s for s, _, _ in v}) > 1]
    return (len(rep), sum(v[0][2] for v in rep), sum(v[0][1] for v in rep), sum(v[-1][1] for v in rep))


if __name__ == "__main__":
    ap = argparse.ArgumentParser()
    ap.add_argument("path", nargs="?", default="runs/quickstart_sql/rollouts.jsonl")
    ap.add_argument("--block", type=int, default=0, help="also print totals over blocks of this many steps")
    a = ap.parse_args()
    g = load(a.path)
    print(table(g))
    if a.block:
        print()
        print(table(g, a.block))
    q, n, first, last = repeated_queries(g)
    print(f"\ngold queries drawn at more than one step: {q}; right at the first draw {first}/{n}, at the last {last}/{n}")
