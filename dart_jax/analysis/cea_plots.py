"""CEA figures (matplotlib, Agg): the numbers come from dart_jax.analysis.cea, nothing is computed here
but bin layouts."""

from __future__ import annotations

import os

import numpy as np

from dart_jax.analysis.cea import COEFS, VARIANTS, Estimate, accuracy_bins

NAMES = {"b12": "β12 (base × tool)", "b13": "β13 (base × reasoning)", "b23": "β23 (tool × reasoning)"}


def _plt():
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    return plt


def beta23_histogram(b23: np.ndarray, estimator: str, acc: np.ndarray, path: str, bins: int = 12) -> str:
    """The paper's figure: the β23 histogram, with the mean M_Unified accuracy of each bin's questions."""
    plt = _plt()
    rows = accuracy_bins(b23, acc, "b23", bins)
    fig, ax = plt.subplots(figsize=(6.4, 4.0))
    lo = [r["lo"] for r in rows]
    width = [r["hi"] - r["lo"] for r in rows]
    ax.bar(lo, [r["count"] for r in rows], width=width, align="edge", color="#4c72b0", edgecolor="white")
    ax.axvline(0.0, color="black", lw=0.8)
    ax.set_xlabel("β23 (tool × reasoning interaction)")
    ax.set_ylabel("questions")
    twin = ax.twinx()
    mids = [r["lo"] + w / 2 for r, w in zip(rows, width)]
    twin.plot(mids, [r["mean_accuracy"] for r in rows], "o-", color="#dd8452", label="mean M_Unified accuracy")
    twin.set_ylim(0, 1)
    twin.set_ylabel("mean M_Unified accuracy in the bin")
    neg = float((b23 < 0).mean()) if len(b23) else float("nan")
    ax.set_title(f"β23 over {len(b23)} questions ({estimator}): {neg:.0%} negative")
    twin.legend(loc="upper right", fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return path


def interaction_histograms(est: Estimate, path: str, bins: int = 12) -> str:
    """β12, β13 and β23 side by side on one x range."""
    plt = _plt()
    cols = [est.beta[:, COEFS.index(c)] for c in ("b12", "b13", "b23")]
    allv = np.concatenate(cols) if len(est.ids) else np.zeros(1)
    edges = np.histogram_bin_edges(allv, bins=bins)
    fig, axes = plt.subplots(1, 3, figsize=(11, 3.4), sharey=True)
    for ax, c, col in zip(axes, ("b12", "b13", "b23"), cols):
        ax.hist(col, bins=edges, color="#55a868" if c != "b23" else "#c44e52", edgecolor="white")
        ax.axvline(0.0, color="black", lw=0.8)
        ax.set_title(f"{NAMES[c]}\nmean {col.mean():+.2f}, {np.mean(col < 0):.0%} < 0" if len(col) else NAMES[c],
                     fontsize=9)
        ax.set_xlabel("coefficient (logit scale)")
    axes[0].set_ylabel("questions")
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return path


def beta23_vs_accuracy(b23: np.ndarray, acc: np.ndarray, path: str) -> str:
    """β23 against M_Unified's accuracy: does interference concentrate on high-accuracy questions?"""
    plt = _plt()
    fig, ax = plt.subplots(figsize=(5.6, 4.0))
    jitter = np.random.default_rng(0).uniform(-0.01, 0.01, size=len(acc))
    ax.scatter(acc + jitter, b23, s=14, alpha=0.6, color="#4c72b0")
    ax.axhline(0.0, color="black", lw=0.8)
    ax.set_xlabel("M_Unified accuracy (k / n, jittered ±0.01)")
    ax.set_ylabel("β23")
    ax.set_title("interaction vs accuracy")
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return path


def write_figures(est: Estimate, raw_acc: np.ndarray, out_dir: str) -> dict[str, str]:
    """raw_acc: f64[Q, 6] k / n of the kept questions (`VARIANTS` order)."""
    u = raw_acc[:, VARIANTS.index("unified")]
    b23 = est.beta[:, COEFS.index("b23")]
    return {"beta23_histogram": beta23_histogram(b23, est.estimator, u, os.path.join(out_dir, "beta23_hist.png")),
            "interactions": interaction_histograms(est, os.path.join(out_dir, "interactions.png")),
            "beta23_vs_accuracy": beta23_vs_accuracy(b23, u, os.path.join(out_dir, "beta23_vs_accuracy.png"))}
