"""Per-step GRPO signal of a SQL run (docs/results/quickstart_sql.md): execution matches, groups with
mixed outcomes (the only groups whose group-normalised advantages are non-zero), answers; the same
in blocks of steps; and the gold queries (by exact query string) drawn at more than one step, first draw vs last.
With --block, also the ORDER BY table per block: rewarded samples whose gold query orders its rows,
sampled final solutions that contain ORDER BY, all-right / all-wrong groups, and the mean token
entropy (`actor/entropy` of the metrics.jsonl beside the rollouts, when there).

    python docs/results/quickstart_sql_groups.py [runs/quickstart_sql/rollouts.jsonl[.gz]] [--block 8]
"""

import argparse
import collections
import gzip
import json
import os
import re
import statistics


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


_ORDER_BY = re.compile(r"\border\s+by\b", re.IGNORECASE)
_SOLUTION = re.compile(r"<solution>(.*?)</solution>", re.DOTALL)


def final_solution(t: dict) -> str | None:
    """The last `<solution>…</solution>` the policy wrote in a stored trajectory (its own pieces: observations
    and the prompt left out), or None."""
    found = _SOLUTION.findall("".join(p["text"] for p in t["pieces"] if p.get("loss")))
    return found[-1] if found else None


def order_table(groups: dict, block: int, entropy: dict[int, float] | None = None) -> str:
    """Per block of steps: rewarded samples, of them with an ORDER BY gold query, sampled final solutions
    containing ORDER BY, mixed groups, all-right / all-wrong groups, mean token entropy."""
    steps = sorted({s for s, _ in groups})
    out = ["| steps | rewarded samples | of them with an ORDER BY gold query | sampled solutions containing ORDER BY "
           "| groups mixed | all right / all wrong | `<solution>` endings | token entropy |",
           "|---|---|---|---|---|---|---|---|"]
    for i in range(0, len(steps), block):
        chunk = steps[i:i + block]
        gs = [g for (st, _), g in groups.items() if st in chunk]
        ts = [t for g in gs for t in g]
        right = [sum(t["score"] > 0 for t in g) for g in gs]
        sol = [final_solution(t) for t in ts]
        ent = [entropy[s] for s in chunk if entropy and s in entropy]
        ent_cell = f"{statistics.fmean(ent):.3f}" if ent else "—"
        out.append(f"| {chunk[0]}–{chunk[-1]} | {sum(t['score'] > 0 for t in ts)} / {len(ts)} "
                   f"| {sum(t['score'] > 0 and bool(_ORDER_BY.search(t['query'])) for t in ts)} "
                   f"| {sum(x is not None and bool(_ORDER_BY.search(x)) for x in sol)} "
                   f"| {sum(0 < r < len(g) for r, g in zip(right, gs))} / {len(gs)} "
                   f"| {sum(r == len(g) for r, g in zip(right, gs))} / {sum(r == 0 for r in right)} "
                   f"| {sum(t['finish'] == 'answer' for t in ts)} / {len(ts)} "
                   f"| {ent_cell} |")
    return "\n".join(out)


def load_entropy(rollouts_path: str) -> dict[int, float]:
    path = os.path.join(os.path.dirname(rollouts_path) or ".", "metrics.jsonl")
    if not os.path.exists(path):
        return {}
    with open(path) as f:
        rows = [json.loads(line) for line in f]
    return {r["step"]: r["actor/entropy"] for r in rows if "actor/entropy" in r}


def repeated_queries(groups: dict) -> tuple[int, int, int, int]:
    """Gold queries (by exact string) drawn at more than one step, in the same or another phrasing: (queries,
    samples at the first draw, right at the first draw, right at the last draw)."""
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
        print()
        print(order_table(g, a.block, load_entropy(a.path)))
    q, n, first, last = repeated_queries(g)
    print(f"\ngold queries drawn at more than one step: {q}; right at the first draw {first}/{n}, "
          f"at the last {last}/{n}")
