"""Per-step GRPO signal of a SQL run (docs/results/quickstart_sql.md): execution matches, groups with
mixed outcomes (the only groups whose group-normalised advantages are non-zero), answers.

    python docs/results/quickstart_sql_groups.py [runs/quickstart_sql/rollouts.jsonl]
"""

import collections
import json
import sys


def main(path: str) -> None:
    groups = collections.defaultdict(list)
    with open(path) as f:
        for line in f:
            r = json.loads(line)
            groups[(r["step"], r["uid"])].append(r)  # uid: the prompt, shared by its group
    steps = sorted({s for s, _ in groups})
    print("| step | execution matches | groups with mixed outcomes | trajectories ending in `<solution>` |")
    print("|---|---|---|---|")
    total = collections.Counter()
    for s in steps:
        gs = [g for (st, _), g in groups.items() if st == s]
        n = sum(len(g) for g in gs)
        match = sum(t["score"] > 0 for g in gs for t in g)
        mixed = sum(0 < sum(t["score"] > 0 for t in g) < len(g) for g in gs)
        answered = sum(t["finish"] == "answer" for g in gs for t in g)
        total.update(n=n, match=match, mixed=mixed, groups=len(gs), answered=answered)
        print(f"| {s} | {match} / {n} | {mixed} / {len(gs)} | {answered} / {n} |")
    print(f"| all | {total['match']} / {total['n']} | {total['mixed']} / {total['groups']} | "
          f"{total['answered']} / {total['n']} |")


if __name__ == "__main__":
    main(sys.argv[1] if len(sys.argv) > 1 else "runs/quickstart_sql/rollouts.jsonl")
