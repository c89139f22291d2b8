"""CEA over training seeds: the trained variants (M_Reas, M_Tool, M_Unified, and so H_Tool, H_Reas) run
with several seeds, M_Base shared; β solved per seed and question (dart_jax.analysis.cea), then pooled.

- **Primary**: the seed- and question-mean of β (β23 first) under the chosen estimator, with a percentile
  interval from a two-way bootstrap over seeds × questions (each resample draws S seeds and Q questions
  with replacement, the same questions for every seed), so training variance is in the interval.
- **Decided questions**: per question, P(seed-mean β23 < 0) from Jeffreys posterior draws of every
  accuracy (each seed's own counts): a question's sign is decided at 90% when that probability is ≥ 0.9
  or ≤ 0.1 — how many questions the data, not the clip, sign.
- **Seed noise floor**: β's ingredients are logit differences between variants; two runs of the same
  variant that differ only in seed (M_Unified of seeds s and t) give the same kind of difference with
  nothing trained differently. Its per-question mean (and the β23 seed means' range) is what β23 must
  exceed to mean anything.
- **Cells** (the lab's (hops, operation)): the primary statistic per cell.
"""

from __future__ import annotations

import itertools
from typing import Mapping

import numpy as np

from dart_jax.analysis import cea
from dart_jax.analysis.tables import markdown_table


def stack(counts_by_seed: Mapping[int, cea.Counts]) -> tuple[list[int], tuple[str, ...], np.ndarray, np.ndarray]:
    """-> (seeds, question ids, k f64[S, Q, 6], n f64[S, Q, 6]); every seed on the same questions."""
    seeds = sorted(counts_by_seed)
    if not seeds:
        raise ValueError("CEA over seeds: no seed's counts")
    ids = counts_by_seed[seeds[0]].ids
    for s in seeds[1:]:
        if counts_by_seed[s].ids != ids:
            raise ValueError(f"CEA over seeds: seed {s} was sampled on other questions than seed {seeds[0]}")
    return seeds, ids, np.stack([counts_by_seed[s].k for s in seeds]), np.stack([counts_by_seed[s].n for s in seeds])


def two_way_bootstrap(x: np.ndarray, n_boot: int = 10_000, seed: int = 0, level: float = 0.95) -> dict:
    """x f64[S, Q] -> {mean, ci, seeds, questions}: the mean with a percentile interval over resamples of
    S seeds and Q questions (the same questions for every seed), with replacement."""
    S, Q = x.shape
    rng = np.random.default_rng(seed)
    boot = np.empty(n_boot)
    for i in range(n_boot):
        boot[i] = x[rng.integers(0, S, S)][:, rng.integers(0, Q, Q)].mean()
    lo, hi = np.quantile(boot, [(1 - level) / 2, (1 + level) / 2])
    return {"mean": float(x.mean()), "ci": [float(lo), float(hi)], "share_ci_below_0": float((boot < 0).mean()),
            "seeds": S, "questions": Q}


def decided(k: np.ndarray, n: np.ndarray, coef: str = "b23", draws: int = 4000, seed: int = 0,
            threshold: float = 0.9) -> dict:
    """k, n f64[S, Q, 6] -> per question P(seed-mean β_coef < 0) under Jeffreys posterior draws of every
    (seed, question, variant) accuracy; counts of questions decided negative / positive at `threshold`."""
    j = cea.COEFS.index(coef)
    rng = np.random.default_rng(seed)
    p = rng.beta(k[None] + 0.5, n[None] - k[None] + 0.5, size=(draws, *k.shape))  # [D, S, Q, 6]
    b = cea.solve(cea.logit(np.clip(p, 1e-12, 1 - 1e-12)))[..., j].mean(1)  # [D, Q]
    p_neg = (b < 0).mean(0)
    return {"coef": coef, "threshold": threshold, "draws": draws, "questions": int(len(p_neg)),
            "negative": int((p_neg >= threshold).sum()), "positive": int((p_neg <= 1 - threshold).sum()),
            "undecided": int(((p_neg < threshold) & (p_neg > 1 - threshold)).sum()), "p_negative": p_neg.tolist()}


def pooled(counts_by_seed: Mapping[int, cea.Counts], estimator: str = "jeffreys", n_boot: int = 10_000,
           boot_seed: int = 0, cells: Mapping[str, str] | None = None) -> dict:
    """β over seeds (see the module's docstring). Questions no variant of any seed answered are dropped.
    `cells`: question id -> cell label (the lab's "h2/compare"); questions without one are left out of the
    cell table."""
    seeds, ids, k, n = stack(counts_by_seed)
    keep = cea.answered(k.sum(0))
    k, n = k[:, keep], n[:, keep]
    kept = [q for q, kq in zip(ids, keep) if kq]
    if not kept:
        raise ValueError(f"CEA over seeds: all {len(ids)} questions were dropped (no variant answered any)")
    z = cea.logit(cea.accuracy(k, n, estimator))  # [S, Q, 6]
    beta = cea.solve(z)
    out = {"seeds": seeds, "estimator": estimator, "questions": len(ids), "kept": len(kept),
           "dropped": int((~keep).sum()), "samples_per_answer": sorted({int(x) for x in np.unique(n)}),
           "variants": {v: [float((k[s, :, i] / n[s, :, i]).mean()) for s in range(len(seeds))]
                        for i, v in enumerate(cea.VARIANTS)},
           "coefficients": {}, "seed_means": {}}
    for j, c in enumerate(cea.COEFS):
        out["coefficients"][c] = two_way_bootstrap(beta[..., j], n_boot, boot_seed)
        out["seed_means"][c] = beta[..., j].mean(1).tolist()
    out["decided"] = {kk: v for kk, v in decided(k, n, seed=boot_seed).items() if kk != "p_negative"}
    u = cea.VARIANTS.index("unified")
    out["seed_noise"] = [dict(a=a, b=b, **_question_boot(z[ia, :, u] - z[ib, :, u], n_boot, boot_seed))
                         for (ia, a), (ib, b) in itertools.combinations(enumerate(seeds), 2)]
    if cells:
        labels = [cells.get(q) for q in kept]
        out["cells"] = []
        for cell in sorted({x for x in labels if x is not None}):
            cols = [i for i, x in enumerate(labels) if x == cell]
            out["cells"].append({"cell": cell, **two_way_bootstrap(beta[:, cols, 5], n_boot, boot_seed)})
    out["per_question"] = [{"id": q, "b23": beta[:, i, 5].tolist(), "b23_mean": float(beta[:, i, 5].mean()),
                            **({"cell": cells.get(q)} if cells else {})} for i, q in enumerate(kept)]
    return out


def _question_boot(x: np.ndarray, n_boot: int, seed: int, level: float = 0.95) -> dict:
    rng = np.random.default_rng(seed)
    idx = rng.integers(0, len(x), size=(n_boot, len(x)))
    lo, hi = np.quantile(x[idx].mean(1), [(1 - level) / 2, (1 + level) / 2])
    return {"mean": float(x.mean()), "ci": [float(lo), float(hi)], "mean_abs": float(np.abs(x).mean())}


def _ci(r: dict) -> str:
    return f"{r['mean']:+.3f} [{r['ci'][0]:+.3f}, {r['ci'][1]:+.3f}]"


def report_markdown(s: dict, title: str = "CEA over seeds") -> str:
    d = s["decided"]
    lines = [f"# {title}", "",
             f"Seeds {s['seeds']} (M_Base shared); {s['questions']} questions, {s['kept']} kept, {s['dropped']} "
             f"dropped (no variant of any seed answered them); samples per accuracy {s['samples_per_answer']}; "
             f"estimator {s['estimator']}. Intervals: percentile bootstrap over seeds × questions.", "",
             "## β, seed- and question-mean", "",
             markdown_table(["coefficient", "mean (95% CI)", "per-seed means"],
                            [[c, _ci(r), ", ".join(f"{x:+.3f}" for x in s["seed_means"][c])]
                             for c, r in s["coefficients"].items()]), "",
             f"Questions whose β23 sign is decided at {d['threshold']:.0%} posterior probability (Jeffreys draws of "
             f"every accuracy, seed-mean β23): {d['negative']} negative, {d['positive']} positive, {d['undecided']} "
             f"undecided of {d['questions']}.", "",
             "## Seed noise floor", "",
             "M_Unified of two seeds (nothing trained differently): the per-question logit difference, its mean "
             "over questions (95% CI, questions resampled) and mean absolute value. β23 adds and subtracts four "
             "such logits.", "",
             markdown_table(["seeds", "mean (95% CI)", "mean |difference|"],
                            [[f"{r['a']} − {r['b']}", _ci(r), f"{r['mean_abs']:.3f}"] for r in s["seed_noise"]])]
    if s.get("cells"):
        lines += ["", "## β23 per cell", "",
                  markdown_table(["cell", "questions", "β23 mean (95% CI)"],
                                 [[r["cell"], r["questions"], _ci(r)] for r in s["cells"]])]
    mean_acc = ", ".join(f"{cea.LABELS[v]} " + "/".join(f"{x:.3f}" for x in a) for v, a in s["variants"].items())
    return "\n".join(lines + ["", f"Mean accuracy per variant (per seed): {mean_acc}.", ""])


SKILLS = ("accuracy", "tool_calls", "tool_skill", "chain_recall", "chain_coverage", "reasoning_skill", "copy_rate")


def skills_markdown(skills: dict) -> str:
    """The lab's role skills of every sampled variant (pooled over its samples; dart_jax/lab/metrics.py)."""
    if not skills:
        return ""
    rows = [[key, d, *(f"{r.get(k, float('nan')):.3f}" for k in SKILLS)] for key, sets in skills.items()
            for d, r in sets.items()]
    return "\n".join(["", "## Role skills per variant (lab sets)", "",
                      markdown_table(["variant", "set", *SKILLS], rows), ""])
