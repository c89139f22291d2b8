"""A run's trajectory records: every trajectory of every step in `rollouts.jsonl`, as text pieces
(written: loss 1, observations: 0) with its score — the input of self-distillation
(`sft.demos.distill_demos`) and of fixed-retrieval replay (`eval.fixed`)."""

from __future__ import annotations

import json
import os

import numpy as np

ROLLOUTS = "rollouts.jsonl"


def append_rollouts(out_dir: str, step: int, tb, rows: list[dict], scores: np.ndarray, accuracy: np.ndarray,
                    valid: np.ndarray, task: str, tokenizer) -> str:
    """Append the trajectories of RL step `step` (1-based, as the metrics) to out_dir/rollouts.jsonl."""
    os.makedirs(out_dir, exist_ok=True)
    path = os.path.join(out_dir, ROLLOUTS)
    with open(path, "a") as f:
        for i, row in enumerate(rows):
            p, n = int(tb.prompt_len[i]), int(tb.length[i])
            ids, mask = tb.ids[i, p:n].tolist(), tb.loss_mask[i, p:n]
            pieces, start = [], 0
            for t in range(1, len(ids) + 1):
                if t == len(ids) or mask[t] != mask[start]:
                    pieces.append({"text": tokenizer.decode(ids[start:t], skip_special_tokens=False),
                                   "loss": int(mask[start] > 0)})
                    start = t
            rec = {"step": step, "uid": tb.uids[i], "data_source": row.get("data_source", "data"), "task": task,
                   "question": row["question"], "pieces": pieces, "score": float(scores[i]),
                   "accuracy": float(accuracy[i]), "finish": tb.finish_reason[i], "in_update": bool(valid[i])}
            for k in ("golden_answers", "db_path", "db_id", "query"):
                if k in row:
                    rec[k] = row[k]
            f.write(json.dumps(rec, ensure_ascii=False) + "\n")
    return path


def trim_rollouts(out_dir: str, step: int) -> None:
    """After a successful resume: keep only trajectories of steps ≤ `step` (drop what the interrupted
    run wrote past its checkpoint)."""
    path = os.path.join(out_dir, ROLLOUTS)
    if not os.path.isfile(path):
        return
    with open(path) as f:
        keep = [line for line in f if line.strip() and json.loads(line)["step"] <= step]
    with open(path, "w") as f:
        f.writelines(keep)
