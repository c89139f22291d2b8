"""Gradient alignment's figures (matplotlib, Agg); the numbers come from grad_report."""

from __future__ import annotations

import numpy as np

COLORS = {"cross": "#c0392b", "same_reasoning": "#2471a3", "same_tool": "#1e8449", "same": "#2471a3",
          "same_reasoning_distinct": "#2471a3", "same_tool_distinct": "#1e8449", "control": "#7f8c8d"}
LABELS = {"cross": "reasoning vs tool (one trajectory)", "same_reasoning": "reasoning vs reasoning",
          "same_tool": "tool vs tool", "same": "tool(A) vs tool(B)",
          "same_reasoning_distinct": "reasoning vs reasoning (distinct)",
          "same_tool_distinct": "tool vs tool (distinct)",
          "control": "random token split (one trajectory)"}


def _plt():
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    return plt


def cross_vs_same(panels: dict[str, dict[str, list]], path: str) -> str:
    """One panel per "params/weighting": histograms (density) of the flattened angles of each pair kind,
    with a Gaussian KDE line where a kind has ≥ 3 distinct angles; 90° marked."""
    from scipy.stats import gaussian_kde
    plt = _plt()
    keys = list(panels)
    cols = min(2, len(keys))
    rows = (len(keys) + cols - 1) // cols
    fig, axes = plt.subplots(rows, cols, figsize=(6 * cols, 3.6 * rows), squeeze=False)
    grid = np.linspace(0, 180, 361)
    for ax, key in zip(axes.ravel(), keys):
        for kind, v in panels[key].items():
            v = np.asarray(v, np.float64)
            v = v[np.isfinite(v)]
            if not len(v):
                continue
            ax.hist(v, bins=np.arange(0, 181, 3), density=True, alpha=0.35, color=COLORS[kind],
                    label=f"{LABELS[kind]} (n {len(v)}, median {np.median(v):.1f}°)")
            if len(np.unique(v)) >= 3:
                ax.plot(grid, gaussian_kde(v)(grid), color=COLORS[kind], lw=1.5)
        ax.axvline(90, color="k", ls=":", lw=1)
        ax.set_title(key)
        ax.set_xlabel("angle between gradients (degrees)")
        ax.set_xlim(0, 180)
        ax.legend(fontsize=7)
    for ax in axes.ravel()[len(keys):]:
        ax.axis("off")
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return path


def per_layer(per_kind: dict[str, dict[int, list]], tests: dict | None, path: str, title: str,
              labels: dict | None = None) -> str:
    """Median and IQR of the angle per layer for each pair kind (layer −1: the tensors outside the
    layer stack: embeddings, final norm); '*' over a layer where the one-sided Wilcoxon (cross > same)
    gives p < 0.05."""
    plt = _plt()
    fig, ax = plt.subplots(figsize=(10, 3.8))
    kinds = list(per_kind)
    width = 0.8 / max(len(kinds), 1)
    top = 0.0
    for k, kind in enumerate(kinds):
        layers = sorted(per_kind[kind])
        stats = [np.percentile(np.asarray(per_kind[kind][ly], np.float64)[np.isfinite(per_kind[kind][ly])],
                               [25, 50, 75]) if len(per_kind[kind][ly]) else (np.nan,) * 3 for ly in layers]
        q1, med, q3 = (np.asarray(s) for s in zip(*stats)) if stats else ([], [], [])
        x = np.asarray(layers, np.float64) + (k - (len(kinds) - 1) / 2) * width
        ax.errorbar(x, med, yerr=[med - q1, q3 - med], fmt="o", ms=3, color=COLORS[kind],
                    label=(labels or LABELS).get(kind, LABELS.get(kind, kind)),
                    capsize=2, lw=1)
        finite = np.asarray(q3, np.float64)[np.isfinite(q3)] if len(q3) else np.zeros(0)
        top = max(top, float(finite.max()) if len(finite) else 0.0)
    for ly, t in (tests or {}).items():
        p = t.get("p", float("nan"))
        if p == p and p < 0.05:
            ax.text(int(ly), top + 2, "*", ha="center", fontsize=12)
    ax.axhline(90, color="k", ls=":", lw=1)
    ax.set_xlabel("layer (−1: embeddings, final norm)")
    ax.set_ylabel("angle (degrees): median, IQR")
    ax.set_title(title)
    ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return path
