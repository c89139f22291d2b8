"""The SQL warm start's two recipes side by side (docs/results/sql_warm_start_smollm2.md):

    python docs/results/plot_sql_warm_start.py [RECIPE1_METRICS RECIPE2_METRICS]

Defaults: the metrics recorded in docs/results/data/ (a run's metrics.jsonl works the same)."""

import json
import os
import sys

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

HERE = os.path.dirname(os.path.abspath(__file__))
DEFAULT = [os.path.join(HERE, "data", f"sql_warm_start_{n}.jsonl") for n in ("recipe1_lr3e-4_b8", "recipe2_lr1e-3_b4")]
LABELS = ["recipe 1: lr 3e-4, batch 8, 2 epochs (36 steps)", "recipe 2: lr 1e-3, batch 4, 1 epoch (36 steps)"]


def main(paths):
    fig, ax = plt.subplots(figsize=(7, 4))
    for path, label, color in zip(paths, LABELS, ("#c44e52", "#4c72b0")):
        rows = [json.loads(line) for line in open(path)]
        ax.plot([r["step"] for r in rows], [r["sft/nll"] for r in rows], color=color, alpha=0.5,
                label=f"{label}: train")
        val = [r for r in rows if "sft/val_nll" in r]
        ax.plot([r["step"] for r in val], [r["sft/val_nll"] for r in val], "o-", color=color,
                label=f"{label}: held back")
    ax.set_xlabel("optimizer step")
    ax.set_ylabel("NLL per written token")
    ax.set_title("SQL warm start, SmolLM2-135M on 2 CPU cores")
    ax.legend(fontsize=7)
    fig.tight_layout()
    out = os.path.join(HERE, "sql_warm_start_curve.png")
    fig.savefig(out, dpi=120)
    print(out)


if __name__ == "__main__":
    main(sys.argv[1:3] if len(sys.argv) > 2 else DEFAULT)
