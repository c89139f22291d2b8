"""Capability Effect Attribution (the paper's interference analysis): per-question β from six variants' accuracies.

Pure numpy / scipy. For each question q and variant M, s_q^M = sigmoid(x^M · β_q) with
x^M = [x1, x2, x3, x12, x13, x23]; the six variants give six independent rows (`DESIGN`), so
z = logit(s) = X β_q is solved exactly. Solving the design by hand gives the contrasts

    β1 = z_B,  β2 = z_HT − z_B,  β3 = z_HR − z_B,  β12 = z_T − z_HT,  β13 = z_R − z_HR,
    β23 = z_U − z_T − z_R + z_B

(B base, R M_Reas, T M_Tool, U M_Unified, HT H_Tool, HR H_Reas): the interference term β23 does
not involve the two compositions at all (tested).

Accuracy estimators: `clip` (the paper: k / n clipped to [1e-4, 1 − 1e-4]) and `jeffreys`
((k + 0.5) / (n + 1), the posterior mean under a Jeffreys prior, which keeps 0 / n and n / n from
becoming ±9.2 on the logit scale). Questions that no variant ever answers are dropped (counted).

Uncertainty (the paper reports none): a bootstrap over questions (seeded, ≥ 10k resamples) for
every coefficient's mean, median and share negative, a two-sided sign test; and a two-level
bootstrap that also draws each accuracy from its Jeffreys posterior given the n recorded answers,
so the interval of "share of questions with β23 < 0" carries the sampling noise of finite n.
"""

from __future__ import annotations

import dataclasses
from typing import Mapping, Sequence

import numpy as np
from scipy import stats

VARIANTS = ("base", "reas", "tool", "unified", "h_tool", "h_reas")
SINGLE = ("base", "reas", "tool", "unified")  # the variants β23 = (z_U − z_T) − (z_R − z_B) reads
LABELS = {"base": "M_Base", "reas": "M_Reas", "tool": "M_Tool", "unified": "M_Unified",
          "h_tool": "H_Tool", "h_reas": "H_Reas"}
COEFS = ("b1", "b2", "b3", "b12", "b13", "b23")
#                 x1 x2 x3 x12 x13 x23
DESIGN = np.array([[1, 0, 0, 0, 0, 0],   # M_Base
                   [1, 0, 1, 0, 1, 0],   # M_Reas
                   [1, 1, 0, 1, 0, 0],   # M_Tool
                   [1, 1, 1, 1, 1, 1],   # M_Unified
                   [1, 1, 0, 0, 0, 0],   # H_Tool: reasoning by M_Base, tool by M_Tool
                   [1, 0, 1, 0, 0, 0]],  # H_Reas: reasoning by M_Reas, tool by M_Base
                  dtype=np.float64)
ESTIMATORS = ("clip", "jeffreys")
CLIP = 1e-4


@dataclasses.dataclass(frozen=True)
class Counts:
    """Correct answers k and samples n per question (rows) and variant (columns, `variants` order: the six
    `VARIANTS`, or the four single-model ones, `SINGLE`, of a study whose compositions were not sampled)."""
    ids: tuple[str, ...]
    k: np.ndarray  # f64[Q, V]
    n: np.ndarray  # f64[Q, V]
    variants: tuple[str, ...] = VARIANTS

    def __post_init__(self):
        if self.variants not in (VARIANTS, SINGLE):
            raise ValueError(f"Counts.variants {self.variants}; expected {VARIANTS} or {SINGLE}")
        q = len(self.ids)
        for name, a in (("k", self.k), ("n", self.n)):
            if a.shape != (q, len(self.variants)):
                raise ValueError(f"Counts.{name} has shape {a.shape}; expected ({q}, {len(self.variants)})")
        if np.any(self.n < 1):
            raise ValueError("every question needs n >= 1 samples from every variant")
        if np.any(self.k < 0) or np.any(self.k > self.n):
            raise ValueError("correct counts must lie in [0, n]")


def counts_from_rows(per_variant: Mapping[str, Sequence[Mapping]], variants: tuple[str, ...] = VARIANTS) -> Counts:
    """Join `launch.evaluate`'s per_question_accuracy rows ({dataset, id, n, correct}) of the six
    variants (or of `variants`: `SINGLE`, for β23 alone) on (dataset, id). Every variant must cover the
    same questions."""
    missing = [v for v in variants if v not in per_variant]
    if missing:
        raise ValueError(f"CEA needs the variants {variants}; missing {missing} (have {sorted(per_variant)})")
    tables = {}
    for v in variants:
        t = {}
        for r in per_variant[v]:
            key = f"{r['dataset']}/{r['id']}"
            if key in t:
                raise ValueError(f"variant {v!r}: question {key} appears twice")
            t[key] = (float(r["correct"]), float(r["n"]))
        tables[v] = t
    ids = sorted(tables["base"])
    for v in variants[1:]:
        if set(tables[v]) != set(ids):
            only_v = sorted(set(tables[v]) - set(ids))[:3]
            only_b = sorted(set(ids) - set(tables[v]))[:3]
            raise ValueError(f"variant {v!r} covers different questions than 'base' (e.g. only in {v}: {only_v}, "
                             f"only in base: {only_b}): sample every variant on the same questions")
    k = np.array([[tables[v][q][0] for v in variants] for q in ids], np.float64).reshape(len(ids), len(variants))
    n = np.array([[tables[v][q][1] for v in variants] for q in ids], np.float64).reshape(len(ids), len(variants))
    return Counts(tuple(ids), k, n, tuple(variants))


def accuracy(k: np.ndarray, n: np.ndarray, estimator: str = "clip", eps: float = CLIP) -> np.ndarray:
    if estimator == "clip":
        return np.clip(k / n, eps, 1.0 - eps)
    if estimator == "jeffreys":
        return (k + 0.5) / (n + 1.0)
    raise ValueError(f"accuracy estimator {estimator!r}; expected one of {ESTIMATORS}")


def logit(y: np.ndarray) -> np.ndarray:
    return np.log(y) - np.log1p(-y)


def solve(z: np.ndarray) -> np.ndarray:
    """z f64[..., 6] (variants in `VARIANTS` order) -> β f64[..., 6] (`COEFS` order): the exact
    inverse of `DESIGN` written as differences (tested against a linear solve), so a tie between
    variants gives a coefficient of exactly 0 — a generic solver returns ±1e-16 there, which would
    land on one side of every sign statistic."""
    zb, zr, zt, zu, zht, zhr = (z[..., i] for i in range(len(VARIANTS)))
    return np.stack([zb, zht - zb, zhr - zb, zt - zht, zr - zhr, (zu - zt) - (zr - zb)], axis=-1)


def betas(z: np.ndarray) -> tuple[tuple[str, ...], np.ndarray]:
    """z f64[..., V] -> (coefficient names, β f64[..., C]): every coefficient (`solve`) from the six
    `VARIANTS`, β23 alone from the four `SINGLE` ones (the same number: `solve`'s β23 never reads the
    compositions)."""
    if z.shape[-1] == len(VARIANTS):
        return COEFS, solve(z)
    if z.shape[-1] == len(SINGLE):
        zb, zr, zt, zu = (z[..., i] for i in range(len(SINGLE)))
        return ("b23",), ((zu - zt) - (zr - zb))[..., None]
    raise ValueError(f"β needs the logits of {VARIANTS} or {SINGLE} in the last axis; got {z.shape}")


def answered(k: np.ndarray) -> np.ndarray:
    """bool[Q]: some variant answered the question at least once (the paper drops the others)."""
    return np.any(k > 0, axis=-1)


@dataclasses.dataclass(frozen=True)
class Estimate:
    ids: tuple[str, ...]  # kept questions
    y: np.ndarray  # f64[Q, 6] accuracies after the estimator
    beta: np.ndarray  # f64[Q, 6]
    dropped: int  # questions no variant ever answered
    estimator: str


def estimate(counts: Counts, estimator: str = "clip", eps: float = CLIP) -> Estimate:
    keep = answered(counts.k)
    y = accuracy(counts.k[keep], counts.n[keep], estimator, eps)
    ids = tuple(q for q, kq in zip(counts.ids, keep) if kq)
    return Estimate(ids, y, solve(logit(y)), int((~keep).sum()), estimator)


def _resample_stats(beta: np.ndarray, idx: np.ndarray) -> dict[str, np.ndarray]:
    """beta f64[Q, C], idx i64[B, Q] -> per-resample mean / median / share negative, each f64[B, C]."""
    b = beta[idx]  # [B, Q, C]
    return {"mean": b.mean(1), "median": np.median(b, 1), "share_negative": (b < 0).mean(1)}


def _ci(x: np.ndarray, level: float) -> np.ndarray:
    a = (1.0 - level) / 2.0
    return np.quantile(x, [a, 1.0 - a], axis=0)


def summarize(beta: np.ndarray, n_boot: int = 10_000, seed: int = 0, level: float = 0.95,
              chunk: int = 500, coefs: Sequence[str] = COEFS) -> dict[str, dict]:
    """Per coefficient: mean, median, share negative, their bootstrap CIs over questions (percentile,
    `n_boot` resamples, seeded), and a two-sided sign test (zeros excluded and counted)."""
    q = beta.shape[0]
    if q == 0:
        raise ValueError("no questions left to summarise (every question was dropped)")
    rng = np.random.default_rng(seed)
    draws: dict[str, list] = {"mean": [], "median": [], "share_negative": []}
    for start in range(0, n_boot, chunk):
        idx = rng.integers(0, q, size=(min(chunk, n_boot - start), q))
        for key, v in _resample_stats(beta, idx).items():
            draws[key].append(v)
    boot = {key: np.concatenate(v) for key, v in draws.items()}
    out = {}
    if beta.shape[1] != len(coefs):
        raise ValueError(f"beta has {beta.shape[1]} columns for {len(coefs)} coefficients {tuple(coefs)}")
    for j, c in enumerate(coefs):
        col = beta[:, j]
        neg, pos = int((col < 0).sum()), int((col > 0).sum())
        row = {"mean": float(col.mean()), "median": float(np.median(col)), "share_negative": neg / q,
               "negative": neg, "positive": pos, "zero": q - neg - pos, "questions": q,
               "sign_test_p": float(stats.binomtest(neg, neg + pos, 0.5).pvalue) if neg + pos else 1.0}
        for key in draws:
            lo, hi = _ci(boot[key][:, j], level)
            row[f"{key}_ci"] = [float(lo), float(hi)]
        out[c] = row
    out["_setup"] = {"n_boot": n_boot, "seed": seed, "level": level, "interval": "percentile bootstrap over questions"}
    return out


def sampling_bootstrap(counts: Counts, n_boot: int = 10_000, seed: int = 0, level: float = 0.95,
                       coef: str = "b23", chunk: int = 250) -> dict:
    """Share of questions with β_coef < 0 *at the true accuracies*, with an interval that carries
    both question sampling and each accuracy's finite-n noise: each resample draws the kept
    questions with replacement, then every (question, variant)'s accuracy from its Jeffreys
    posterior Beta(k + ½, n − k + ½) (never 0 or 1, so no clip), and solves β. Reported: the
    median and percentile interval of the share over resamples. It can sit away from the share of
    the point estimates: those are noisy (a clipped 0 / n is ±9.2 on the logit scale), and this
    is about the accuracies the answers were drawn from.

    Caveats: the six variants are resampled independently, but sampled with the same seeds
    (rollout.sampler keys draws by row and position) their answers are positively correlated
    (H_Tool follows M_Base until its first tool span), so for contrasts the interval is
    conservative. Needs integer counts (one score in {0, 1} per answer)."""
    j = COEFS.index(coef)
    return _posterior_share(counts.k, counts.n, lambda z: solve(z)[..., j], coef, n_boot, seed, level, chunk)


def _posterior_share(k: np.ndarray, n: np.ndarray, coef_of_z, coef: str, n_boot: int, seed: int, level: float,
                     chunk: int) -> dict:
    """Share of kept questions with coef_of_z(logit accuracies) < 0, over resamples that draw the
    questions with replacement and each accuracy from its Jeffreys posterior Beta(k + ½, n − k + ½)."""
    k, n = np.asarray(k, np.float64), np.asarray(n, np.float64)
    if not np.allclose(k, np.round(k)):
        raise ValueError("the true-accuracy bootstrap needs integer correct counts (binary scores per answer)")
    keep = answered(k)
    k, n = k[keep], n[keep]
    q = len(k)
    if q == 0:
        raise ValueError("no questions left (every question was dropped)")
    rng = np.random.default_rng(seed)
    shares = []
    for start in range(0, n_boot, chunk):
        b = min(chunk, n_boot - start)
        idx = rng.integers(0, q, size=(b, q))
        p = rng.beta(k[idx] + 0.5, n[idx] - k[idx] + 0.5)  # [b, q, variants]
        shares.append((coef_of_z(logit(np.clip(p, 1e-12, 1 - 1e-12))) < 0).mean(1))
    s = np.concatenate(shares)
    lo, hi = np.quantile(s, [(1 - level) / 2, 1 - (1 - level) / 2])
    return {"coef": coef, "median": float(np.median(s)), "ci": [float(lo), float(hi)], "n_boot": n_boot,
            "seed": seed, "level": level, "questions": q,
            "interval": "percentile bootstrap over questions × Jeffreys posterior draws of each accuracy"}


def accuracy_bins(beta: np.ndarray, acc: np.ndarray, coef: str = "b23", bins: int = 10) -> list[dict]:
    """The paper's histogram: β_coef in equal-width bins, each with its count and the mean accuracy of
    its questions (`acc`: f64[Q], e.g. M_Unified's raw k / n). `beta`: f64[Q, 6], or f64[Q] (that
    coefficient alone)."""
    col = beta if beta.ndim == 1 else beta[:, COEFS.index(coef)]
    if not len(col):
        return []
    edges = np.histogram_bin_edges(col, bins=bins)
    which = np.clip(np.digitize(col, edges[1:-1]), 0, bins - 1)
    return [{"lo": float(edges[i]), "hi": float(edges[i + 1]), "count": int((which == i).sum()),
             "mean_accuracy": float(acc[which == i].mean()) if (which == i).any() else float("nan")}
            for i in range(bins)]


# -- β23 alone: the interference term needs no composition ------------------------------------------


def interference(k: np.ndarray, n: np.ndarray, estimator: str = "clip", eps: float = CLIP
                 ) -> tuple[np.ndarray, np.ndarray]:
    """β23 per question from the four single-model variants only (k, n: f64[Q, 4] in `SINGLE`
    order) -> (kept bool[Q], β23 f64[kept]): the number `solve` gives, which never reads H_Tool /
    H_Reas (tested), for a study whose compositions were not sampled. The drop rule is over these
    four variants, so a question only a composition answered would be kept by the full solve and
    dropped here."""
    k, n = np.asarray(k, np.float64), np.asarray(n, np.float64)
    if k.shape != n.shape or k.ndim != 2 or k.shape[1] != len(SINGLE):
        raise ValueError(f"interference needs k, n of shape [Q, {len(SINGLE)}] ({SINGLE}); got {k.shape}, {n.shape}")
    keep = answered(k)
    return keep, betas(logit(accuracy(k[keep], n[keep], estimator, eps)))[1][:, 0]


def interference_bootstrap(k: np.ndarray, n: np.ndarray, n_boot: int = 10_000, seed: int = 0,
                           level: float = 0.95, chunk: int = 250) -> dict:
    """`sampling_bootstrap`'s share of β23 < 0 at the true accuracies, from the four single-model
    variants (k, n: f64[Q, 4] in `SINGLE` order, integer counts)."""
    return _posterior_share(k, n, lambda z: (z[..., 3] - z[..., 2]) - (z[..., 1] - z[..., 0]), "b23", n_boot, seed,
                            level, chunk)
