"""The three CEA training runs side by side (docs/results/cea_smollm2.md): training reward per step
and the share of trajectories that end in an answer.

    python docs/results/plot_cea_training.py [RUN_ROOT]

RUN_ROOT holds reas/, tool/, unified/ with their metrics.jsonl (a `launch.cea` output's train/);
default: the metrics recorded in docs/results/data/cea_smollm2/."""

import json
import os
import sys

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

HERE = os.path.dirname(os.path.abspath(__file__))
DEFAULT = os.path.join(HERE, "data", "cea_smollm2")
RUNS = (("reas", "M_Reas (reasoning tokens)", "#4c72b0"), ("tool", "M_Tool (tool-span tokens)", "#dd8452"),
        ("unified", "M_Unified (all tokens)", "#55a868"))


def _rows(root, v):
    for path in (os.path.join(root, v, "metrics.jsonl"), os.path.join(root, f"{v}.metrics.jsonl")):
        if os.path.isfile(path):
            with open(path) as f:
                return [r for r in map(json.loads, f) if "reward/mean" in r]
    raise FileNotFoundError(f"no metrics for {v} under {root}")


def main(root):
    fig, axes = plt.subplots(1, 2, figsize=(10, 3.8))
    for v, label, color in RUNS:
        rows = _rows(root, v)
        steps = [r["step"] for r in rows]
        axes[0].plot(steps, [r["reward/mean"] for r in rows], "o-", color=color, label=label, alpha=0.8)
        axes[1].plot(steps, [r["protocol/answer_rate"] for r in rows], "o-", color=color, label=label, alpha=0.8)
    axes[0].set_ylabel("training reward (EM, 16 trajectories a step)")
    axes[1].set_ylabel("trajectories ending in <answer>")
    for ax in axes:
        ax.set_xlabel("GRPO step")
        ax.grid(alpha=0.3)
    axes[0].legend(fontsize=8)
    fig.suptitle("CEA variants: full-parameter GRPO from SmolLM2-135M + warm start, same data and seed (2 CPU cores)",
                 fontsize=9)
    fig.tight_layout()
    out = os.path.join(HERE, "cea_smollm2_training.png")
    fig.savefig(out, dpi=120)
    print(out)


if __name__ == "__main__":
    main(sys.argv[1] if len(sys.argv) > 1 else DEFAULT)
