"""Training metrics: one jsonl line per step, TensorBoard scalars, and the reward-curve plot."""

from __future__ import annotations

import json
import math
import os
from typing import Iterable

PLOT_KEYS = ("reward/mean", "eval/reward", "protocol/answer_rate", "actor/kl", "actor/entropy")


class MetricsWriter:
    """Appends to <dir>/metrics.jsonl and TensorBoard events in <dir>/tb. On resume, lines after the
    restored step are dropped first, so the file always describes the parameters on disk."""

    def __init__(self, directory: str, resume_step: int | None = None, tensorboard: bool = True):
        os.makedirs(directory, exist_ok=True)
        self.path = os.path.join(directory, "metrics.jsonl")
        if resume_step is not None and os.path.isfile(self.path):
            kept = [r for r in read_metrics(self.path) if r.get("step", 0) <= resume_step]
            with open(self.path, "w") as f:
                f.writelines(json.dumps(r) + "\n" for r in kept)
        elif resume_step is None and os.path.isfile(self.path):
            os.remove(self.path)
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
    with open(path) as f:
        return [json.loads(line) for line in f if line.strip()]


def plot_curves(metrics_path: str, out_path: str, keys: Iterable[str] = PLOT_KEYS) -> str:
    """Reward (per data source too) and protocol / KL / entropy curves against the step."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    rows = read_metrics(metrics_path)
    keys = [k for k in keys if any(k in r for r in rows)]
    sources = sorted({k for r in rows for k in r if k.startswith("reward/") and k not in ("reward/mean", "reward/std")})
    sources = sources if len(sources) > 1 else []  # one source: its curve is the mean's
    panels = [(k, [k] + sources if k == "reward/mean" else [k]) for k in keys]
    if not panels:
        raise ValueError(f"{metrics_path}: none of {list(keys)} recorded")
    fig, axes = plt.subplots(1, len(panels), figsize=(4.2 * len(panels), 3.4), squeeze=False)
    for ax, (title, series) in zip(axes[0], panels):
        for k in series:
            pts = [(r["step"], r[k]) for r in rows if k in r and r[k] is not None]
            if pts:
                ax.plot(*zip(*pts), marker="o", ms=3, label=k.split("/", 1)[-1])
            if k == "reward/mean" and len(pts) >= 8:  # per-step rewards are noisy: show the trend too
                w = max(3, len(pts) // 6)
                steps, vals = zip(*pts)
                avg = [sum(vals[i - w + 1:i + 1]) / w for i in range(w - 1, len(vals))]
                ax.plot(steps[w - 1:], avg, ls="--", color="k", label=f"mean, {w}-step average")
        ax.set_title(title)
        ax.set_xlabel("step")
        ax.grid(alpha=0.3)
        if len(series) > 1:
            ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(out_path, dpi=110)
    plt.close(fig)
    return out_path
