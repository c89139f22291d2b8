"""Training metrics: one jsonl line per step, TensorBoard scalars, and the reward-curve plot."""

from __future__ import annotations

import json
import math
import os
from typing import Iterable

from dart_jax.analysis.intervals import wilson_interval
from dart_jax.run.records import read_records, rewrite_records

PLOT_KEYS = ("reward/mean", "eval/reward", "protocol/answer_rate", "actor/kl", "actor/entropy")


class MetricsWriter:
    """Appends to <dir>/metrics.jsonl and TensorBoard events in <dir>/tb. On resume, lines after the
    restored step are dropped first, so the file always describes the parameters on disk (a last line
    cut short by a crash is set aside in metrics.jsonl.torn: `records.rewrite_records`); otherwise
    nothing is removed (a fresh run into a directory with records is refused before: `run_dir`)."""

    def __init__(self, directory: str, resume_step: int | None = None, tensorboard: bool = True):
        os.makedirs(directory, exist_ok=True)
        self.path = os.path.join(directory, "metrics.jsonl")
        if resume_step is not None and os.path.isfile(self.path):
            rewrite_records(self.path, lambda r: r.get("step", 0) <= resume_step)
        self.tb = None
        if tensorboard:
            from tensorboardX import SummaryWriter
            self.tb = SummaryWriter(os.path.join(directory, "tb"))

    def write(self, step: int, metrics: dict) -> None:
        row = {"step": step, **{k: _py(v) for k, v in metrics.items()}}
        with open(self.path, "a") as f:
            f.write(json.dumps(row) + "\n")
        if self.tb is not None:
            for k, v in row.items():
                if k != "step" and isinstance(v, (int, float)) and math.isfinite(v):
                    self.tb.add_scalar(k, v, step)
            self.tb.flush()

    def close(self) -> None:
        if self.tb is not None:
            self.tb.close()


def _py(v):
    if hasattr(v, "item"):
        v = v.item()
    return v


def read_metrics(path: str) -> list[dict]:
    """The rows of a metrics.jsonl (a last line cut short by a crash skipped, logged)."""
    return read_records(path)


def plot_curves(metrics_path: str, out_path: str, keys: Iterable[str] = PLOT_KEYS) -> str:
    """Reward (per data source too) and protocol / KL / entropy curves against the step. The training
    reward is drawn with its per-step spread (mean ± std band over the step's trajectories, min–max
    whiskers) and a moving average; held-out results as correct counts out of n with 95% Wilson
    intervals, so a reader sees what is noise (8 → 9 of 32 is not a trend)."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    rows = read_metrics(metrics_path)
    keys = [k for k in keys if any(k in r for r in rows)]
    sources = sorted({k for r in rows for k in r if k.startswith("reward/") and k.split("/", 1)[1] not in
                      ("mean", "std", "min", "max", "dropped_prompts")
                      and not k.startswith(("reward/qa_", "reward/sql_"))})
    sources = sources if len(sources) > 1 else []  # one source: its curve is the mean's
    panels = [(k, [k] + sources if k == "reward/mean" else [k]) for k in keys]
    if not panels:
        raise ValueError(f"{metrics_path}: none of {list(keys)} recorded")
    fig, axes = plt.subplots(1, len(panels), figsize=(4.2 * len(panels), 3.4), squeeze=False)
    for ax, (title, series) in zip(axes[0], panels):
        if title == "eval/reward" and any("eval/correct" in r for r in rows):
            _held_out_panel(ax, rows)
            continue
        for k in series:
            pts = [(r["step"], r[k]) for r in rows if k in r and r[k] is not None]
            if pts:
                ax.plot(*zip(*pts), marker="o", ms=3, label=k.split("/", 1)[-1])
            if k == "reward/mean":
                _spread(ax, rows)
            if k == "reward/mean" and len(pts) >= 8:  # per-step rewards are noisy: show the trend too
                w = max(3, len(pts) // 6)
                steps, vals = zip(*pts)
                avg = [sum(vals[i - w + 1:i + 1]) / w for i in range(w - 1, len(vals))]
                ax.plot(steps[w - 1:], avg, ls="--", color="k", label=f"mean, {w}-step average")
        ax.set_title(title)
        ax.set_xlabel("step")
        ax.grid(alpha=0.3)
        if title.endswith("_rate"):  # a share: the whole 0–1 axis, never a zoom that makes noise look steep
            ax.set_ylim(-0.02, 1.02)
        if len(series) > 1 or title == "reward/mean":
            ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(out_path, dpi=110)
    plt.close(fig)
    return out_path


def _spread(ax, rows: list[dict]) -> None:
    pts = [(r["step"], r["reward/mean"], r["reward/std"], r.get("reward/min"), r.get("reward/max")) for r in rows
           if "reward/mean" in r and "reward/std" in r]
    if not pts:
        return
    steps, mean, std, lo, hi = zip(*pts)
    ranged = all(v is not None for v in lo + hi)
    below = [max(m - s, a) if ranged else m - s for m, s, a in zip(mean, std, lo)]  # within the observed range
    above = [min(m + s, b) if ranged else m + s for m, s, b in zip(mean, std, hi)]
    ax.fill_between(steps, below, above, alpha=0.2, color="C0", label="± std over the step's trajectories")
    if ranged:
        ax.vlines(steps, lo, hi, color="C0", alpha=0.35, lw=0.8, label="min–max")


def _held_out_panel(ax, rows: list[dict]) -> None:
    pts = [(r["step"], int(r["eval/correct"]), int(r.get("eval/scored", r["eval/n"]))) for r in rows
           if "eval/correct" in r]
    steps = [p[0] for p in pts]
    k = [p[1] for p in pts]
    n = max(p[2] for p in pts)
    lo, hi = zip(*(wilson_interval(c, m) for _, c, m in pts))
    ax.errorbar(steps, k, yerr=[[c - a * m for c, a, (_, _, m) in zip(k, lo, pts)],
                                [b * m - c for c, b, (_, _, m) in zip(k, hi, pts)]],
                fmt="o-", ms=4, capsize=3, label="correct (95% Wilson interval)")
    ax.set_ylim(0, n)
    ax.set_title(f"held-out: correct of {n}")
    ax.set_xlabel("step")
    ax.grid(alpha=0.3)
    ax.legend(fontsize=7)
