"""Post-hoc (the grouping was chosen after seeing the counts): do the runs that train every weight
(full FT, full 2-Agent) score lower on the held-out sets than the runs that train adapters over the
frozen base (DART, LoRA-16, MixLoRA, 2-Agent-LoRA)? Reads the committed archive only.

    python docs/results/data/methods_smollm2/posthoc_full_vs_adapters.py

Two views. Runs: the difference of mean counts between the groups, with an exact two-sided
permutation test (the share of the ways of assigning the runs to groups of the same sizes whose
absolute difference reaches the observed one; runs as the unit: seeds vary, questions fixed). Questions: per
question the share of each group's runs that answered it, and an exact sign test over the questions where the
shares differ (questions as the unit: generalises over questions, not over seeds)."""

import gzip
import json
import os
import sys

import numpy as np
from scipy import stats

HERE = os.path.dirname(os.path.abspath(__file__))
EVAL = os.path.join(HERE, "archive", "eval")
FULL = ("full", "2agent")
ADAPTERS = ("dart", "lora16", "mixlora", "2agent_lora")


def method(run: str) -> str:
    return run.rsplit("_s", 1)[0]


def load(run: str) -> dict:
    with gzip.open(os.path.join(EVAL, run, "per_question.jsonl.gz"), "rt") as f:
        return {(r["dataset"], r["id"]): float(r["score"]) for r in map(json.loads, f)}


def main() -> int:
    runs = sorted(r for r in os.listdir(EVAL) if r != "warm_start")
    groups = {"full-parameter": [r for r in runs if method(r) in FULL],
              "adapters": [r for r in runs if method(r) in ADAPTERS]}
    other = set(runs) - set(groups["full-parameter"]) - set(groups["adapters"])
    if other:
        sys.exit(f"runs of no group: {sorted(other)}")
    per = {r: load(r) for r in runs}
    warm = load("warm_start")
    for ds in ("nq_corpus_heldout", "hotpotqa_corpus"):
        keys = sorted(k for k in warm if k[0] == ds)
        count = {r: sum(per[r][k] for k in keys) for r in runs}
        a = np.array([count[r] for r in groups["full-parameter"]])
        b = np.array([count[r] for r in groups["adapters"]])
        # two-sided as the share of assignments whose |difference| reaches the observed one (exact: all of them)
        res = stats.permutation_test((a, b), lambda x, y: abs(np.mean(x) - np.mean(y)),
                                     permutation_type="independent", n_resamples=np.inf, alternative="greater")
        diff = np.mean(a) - np.mean(b)
        print(f"\n{ds} ({len(keys)} questions; warm start {sum(warm[k] for k in keys):.0f})")
        for g, rs in groups.items():
            print(f"  {g}: " + ", ".join(f"{r} {count[r]:.0f}" for r in rs) +
                  f"; mean {np.mean([count[r] for r in rs]):.2f}")
        print(f"  runs: mean difference {diff:+.2f} questions, exact permutation p {res.pvalue:.3g} "
              f"(two-sided, {len(a)} vs {len(b)} runs)")
        share = {g: np.array([np.mean([per[r][k] for r in rs]) for k in keys]) for g, rs in groups.items()}
        by_q = share["full-parameter"] - share["adapters"]
        up, down = int((by_q > 0).sum()), int((by_q < 0).sum())
        p = stats.binomtest(up, up + down).pvalue if up + down else 1.0
        print(f"  questions: full-parameter share higher on {up}, adapters' higher on {down}, "
              f"equal on {len(keys) - up - down}; exact sign test p {p:.3g}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
