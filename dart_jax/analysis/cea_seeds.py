"""CEA over training seeds: the trained variants (M_Reas, M_Tool, M_Unified, and so H_Tool, H_Reas) run
with several seeds, M_Base shared; β solved per seed and question (dart_jax.analysis.cea), then pooled.

- **Primary**: the seed- and question-mean of β (β23 first) under the chosen estimator, with a percentile
  interval from a two-way bootstrap over seeds × questions (each resample draws S seeds and Q questions
  with replacement, the same questions for every seed), so training variance is in the interval.
  With a handful of seeds the bootstrap under-states the seeds' variance (a resample of 3 seeds holds
  one seed 1 time in 9), so a t interval on the per-seed means (S − 1 degrees of freedom) stands beside it.
- **Decided questions**: per question, P(seed-mean β23 < 0) from Jeffreys posterior draws of every
  accuracy (each seed's own counts; M_Base, one sample shared by every seed, drawn once): a question's
  sign is decided at 90% when that probability is ≥ 0.9 or ≤ 0.1 — how many questions the data, not
  the clip, sign.
- **Seed noise floor (placebo)**: a contrast of β23's shape between two seeds of the same variants,
  π_q(s, t) = (z_U,s − z_U,t) − (z_R,s − z_R,t): four sampled logits, like β23, but nothing differs
  except the seed, so its expectation is 0 and its spread is what seed and sampling noise alone give.
  Reported per seed pair with its interval over questions and its per-question standard deviation,
  beside β23's per-question standard deviation and the spread of β23's seed means.
- **Cells** (the lab's (hops, operation)): the primary statistic per cell.
"""

from __future__ import annotations

import itertools
from typing import Mapping

import numpy as np

from dart_jax.analysis import cea
from dart_jax.analysis.tables import markdown_table


def stack(counts_by_seed: Mapping[int, cea.Counts]) -> tuple[list[int], tuple[str, ...], np.ndarray, np.ndarray]:
    """-> (seeds, question ids, k f64[S, Q, V], n f64[S, Q, V]); every seed on the same questions and variants
    (V: the six, or the four single-model ones of a β23-only study)."""
    seeds = sorted(counts_by_seed)
    if not seeds:
        raise ValueError("CEA over seeds: no seed's counts")
    ids, variants = counts_by_seed[seeds[0]].ids, counts_by_seed[seeds[0]].variants
    for s in seeds[1:]:
        if counts_by_seed[s].ids != ids:
            raise ValueError(f"CEA over seeds: seed {s} was sampled on other questions than seed {seeds[0]}")
        if counts_by_seed[s].variants != variants:
            raise ValueError(f"CEA over seeds: seed {s} has the variants {counts_by_seed[s].variants}, seed "
                             f"{seeds[0]} {variants}")
    return seeds, ids, np.stack([counts_by_seed[s].k for s in seeds]), np.stack([counts_by_seed[s].n for s in seeds])


def two_way_bootstrap(x: np.ndarray, n_boot: int = 10_000, seed: int = 0, level: float = 0.95) -> dict:
    """x f64[S, Q] -> {mean, ci, seeds, questions}: the mean with a percentile interval over resamples of
    S seeds and Q questions (the same questions for every seed), with replacement."""
    from dart_jax.analysis.intervals import two_way_resamples
    S, Q = x.shape
    boot = two_way_resamples(x, n_boot, seed)
    lo, hi = np.quantile(boot, [(1 - level) / 2, (1 + level) / 2])
    out = {"mean": float(x.mean()), "ci": [float(lo), float(hi)], "share_resamples_below_0": float((boot < 0).mean()),
           "seeds": S, "questions": Q}
    if S > 1:  # the seeds' means with a t interval (S − 1 degrees of freedom)
        from scipy import stats
        m = x.mean(1)
        half = stats.t.ppf((1 + level) / 2, S - 1) * m.std(ddof=1) / np.sqrt(S)
        out["seed_t_ci"] = [float(m.mean() - half), float(m.mean() + half)]
    return out


def decided(k: np.ndarray, n: np.ndarray, coef: str = "b23", draws: int = 4000, seed: int = 0,
            threshold: float = 0.9, chunk: int = 250) -> dict:
    """k, n f64[S, Q, V] (V: the six variants, or the four single-model ones) -> per question P(seed-mean
    β_coef < 0) under Jeffreys posterior draws of every (seed, question, variant) accuracy; counts of
    questions decided negative / positive at `threshold`. A variant column that is the same sample in every
    seed (M_Base) is drawn once per question and shared by the seeds (drawing it per seed would average its
    noise away)."""
    j = cea.betas(np.zeros(k.shape[-1]))[0].index(coef)
    shared = [i for i in range(k.shape[-1]) if np.array_equal(k[:, :, i], k[:1, :, i].repeat(len(k), 0))
              and np.array_equal(n[:, :, i], n[:1, :, i].repeat(len(n), 0))] if len(k) > 1 else []
    rng = np.random.default_rng(seed)
    below = np.zeros(k.shape[1])
    for start in range(0, draws, chunk):
        d = min(chunk, draws - start)
        p = rng.beta(k[None] + 0.5, n[None] - k[None] + 0.5, size=(d, *k.shape))  # [d, S, Q, 6]
        for i in shared:  # one draw per question, the same in every seed
            p[:, :, :, i] = p[:, :1, :, i]
        below += (cea.betas(cea.logit(np.clip(p, 1e-12, 1 - 1e-12)))[1][..., j].mean(1) < 0).sum(0)
    p_neg = below / draws
    return {"coef": coef, "threshold": threshold, "draws": draws, "questions": int(len(p_neg)),
            "negative": int((p_neg >= threshold).sum()), "positive": int((p_neg <= 1 - threshold).sum()),
            "undecided": int(((p_neg < threshold) & (p_neg > 1 - threshold)).sum()), "p_negative": p_neg.tolist()}


def pooled(counts_by_seed: Mapping[int, cea.Counts], estimator: str = "jeffreys", n_boot: int = 10_000,
           boot_seed: int = 0, cells: Mapping[str, str] | None = None) -> dict:
    """β over seeds (see the module's docstring). Questions no variant of any seed answered are dropped.
    `cells`: question id -> cell label (the lab's "h2/compare"); questions without one are left out of the
    cell table. Counts of the four single-model variants (`cea.SINGLE`) give β23 alone (its drop rule then
    sees those four)."""
    seeds, ids, k, n = stack(counts_by_seed)
    variants = counts_by_seed[seeds[0]].variants
    keep = cea.answered(k.sum(0))
    k, n = k[:, keep], n[:, keep]
    kept = [q for q, kq in zip(ids, keep) if kq]
    if not kept:
        raise ValueError(f"CEA over seeds: all {len(ids)} questions were dropped (no variant answered any)")
    z = cea.logit(cea.accuracy(k, n, estimator))  # [S, Q, V]
    coefs, beta = cea.betas(z)
    b23 = beta[..., coefs.index("b23")]
    out = {"seeds": seeds, "estimator": estimator, "questions": len(ids), "kept": len(kept),
           "dropped": int((~keep).sum()), "samples_per_answer": sorted({int(x) for x in np.unique(n)}),
           "variants": {v: [float((k[s, :, i] / n[s, :, i]).mean()) for s in range(len(seeds))]
                        for i, v in enumerate(variants)},
           "coefficients": {}, "seed_means": {}}
    for j, c in enumerate(coefs):
        out["coefficients"][c] = two_way_bootstrap(beta[..., j], n_boot, boot_seed)
        out["seed_means"][c] = beta[..., j].mean(1).tolist()
    out["decided"] = {kk: v for kk, v in decided(k, n, seed=boot_seed).items() if kk != "p_negative"}
    u, r = variants.index("unified"), variants.index("reas")
    out["seed_noise"] = [dict(a=a, b=b, **_question_boot((z[ia, :, u] - z[ib, :, u]) - (z[ia, :, r] - z[ib, :, r]),
                                                         n_boot, boot_seed))
                         for (ia, a), (ib, b) in itertools.combinations(enumerate(seeds), 2)]
    out["b23_spread"] = {"per_question_sd": float(b23.mean(0).std(ddof=1)) if len(kept) > 1 else 0.0,
                         "seed_means_sd": float(b23.mean(1).std(ddof=1)) if len(seeds) > 1 else 0.0}
    if cells:
        labels = [cells.get(q) for q in kept]
        out["cells"] = []
        for cell in sorted({x for x in labels if x is not None}):
            cols = [i for i, x in enumerate(labels) if x == cell]
            out["cells"].append({"cell": cell, **two_way_bootstrap(b23[:, cols], n_boot, boot_seed)})
    out["per_question"] = [{"id": q, "b23": b23[:, i].tolist(), "b23_mean": float(b23[:, i].mean()),
                            **({"cell": cells.get(q)} if cells else {})} for i, q in enumerate(kept)]
    return out


def _question_boot(x: np.ndarray, n_boot: int, seed: int, level: float = 0.95) -> dict:
    rng = np.random.default_rng(seed)
    idx = rng.integers(0, len(x), size=(n_boot, len(x)))
    lo, hi = np.quantile(x[idx].mean(1), [(1 - level) / 2, (1 + level) / 2])
    return {"mean": float(x.mean()), "ci": [float(lo), float(hi)], "mean_abs": float(np.abs(x).mean()),
            "sd": float(x.std(ddof=1)) if len(x) > 1 else 0.0}


def _ci(r: dict) -> str:
    return f"{r['mean']:+.3f} [{r['ci'][0]:+.3f}, {r['ci'][1]:+.3f}]"


def report_markdown(s: dict, title: str = "CEA over seeds") -> str:
    d = s["decided"]
    lines = [f"# {title}", "",
             f"Seeds {s['seeds']} (M_Base shared); {s['questions']} questions, {s['kept']} kept, {s['dropped']} "
             f"dropped (no variant of any seed answered them); samples per accuracy {s['samples_per_answer']}; "
             f"estimator {s['estimator']}. Intervals: percentile bootstrap over seeds × questions."
             + ("" if len(s["variants"]) == len(cea.VARIANTS) else " β23 alone, from the four single-model "
                "variants: H_Tool / H_Reas were not sampled (β23 = (z_U − z_T) − (z_R − z_B) does not read them), "
                "and the drop rule sees these four."), "",
             "## β, seed- and question-mean", "",
             markdown_table(["coefficient", "mean (95% CI)", "t interval on the seed means", "per-seed means"],
                            [[c, _ci(r), "[{:+.3f}, {:+.3f}]".format(*r["seed_t_ci"]) if "seed_t_ci" in r else "—",
                              ", ".join(f"{x:+.3f}" for x in s["seed_means"][c])]
                             for c, r in s["coefficients"].items()]), "",
             "With few seeds the bootstrap's resamples under-state the seeds' variance; the t interval on the "
             "seed means (S − 1 degrees of freedom) is the cautious reading of the training variance.", "",
             f"Questions whose β23 sign is decided at {d['threshold']:.0%} posterior probability (Jeffreys draws of "
             f"every accuracy, seed-mean β23): {d['negative']} negative, {d['positive']} positive, {d['undecided']} "
             f"undecided of {d['questions']}.", "",
             "## Seed noise floor", "",
             "A placebo of β23's shape between two seeds, π = (z_U,s − z_U,t) − (z_R,s − z_R,t): four sampled "
             "logits, nothing different but the seed (expectation 0). Its mean over questions (95% CI, questions "
             f"resampled) and per-question SD, against β23's per-question SD "
             f"{s['b23_spread']['per_question_sd']:.3f} (seed-mean β23) and the SD of β23's seed means "
             f"{s['b23_spread']['seed_means_sd']:.3f}.", "",
             markdown_table(["seeds", "placebo mean (95% CI)", "per-question SD", "mean |placebo|"],
                            [[f"{r['a']} − {r['b']}", _ci(r), f"{r['sd']:.3f}", f"{r['mean_abs']:.3f}"]
                             for r in s["seed_noise"]])]
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
