"""Held-out rollouts during training: does the policy follow the protocol, and how often is it right?

Shared by the SFT protocol check (before / after the warm start) and the GRPO trainer's periodic
evaluation (`config.eval`): the same agent, tool and rewards as training, on questions training
never sees, greedy by default (temperature 0), so the numbers move only when the policy does.
"""

from __future__ import annotations

import numpy as np

from dart_jax.lab.metrics import batch_records, finite, role_skills
from dart_jax.parallel.distributed import gather_results, mine, rounds
from dart_jax.rewards.qa import em_reward
from dart_jax.rewards.training import make_reward
from dart_jax.rollout.agent import Agent, RolloutConfig
from dart_jax.rollout.compose import rollout_policy
from dart_jax.rollout.sampling import SamplingConfig
from dart_jax.rollout.tasks import overlong, qa_task, sql_task


def rollout_eval(cfg, tokenizer, protocol, tool_fn, rollout: RolloutConfig, router_convention: str, base, adapters,
                 rows: list[dict], temperature: float = 0.0, batch: int = 8, seed: int = 0, reward=None,
                 mesh=None) -> dict:
    """-> {n, skipped_overlong, answer_rate, invalid_rate, tool_calls, reward, correct, example} over `rows` (task rows;
    rows without a reference — demonstrations from a file may have none — are skipped). `reward`: the
    run's training reward (`rewards.training`; default the task's paper reward); rows whose reference
    fails (a broken gold query) leave the reward mean. `correct` counts EM = 1 / an execution match.
    Multi-process: each process rolls out every process_count-th batch on `mesh` (its sub-mesh; the
    same batches and seeds as one process) and the sums are gathered."""
    need = ("db_path", "query") if protocol.name == "sql" else ("golden_answers",)
    rows = [r for r in rows if all(r.get(k) for k in need)]
    if not rows:
        return {}
    task_fn = sql_task if protocol.name == "sql" else qa_task
    prompts, uids, metas = task_fn(tokenizer, rows, rollout.prompt_tags)
    # the context rule (rollout.tasks.overlong): a prompt that leaves less than one turn is skipped, counted
    refused = overlong(prompts, cfg.max_position_embeddings, rollout)
    skipped = sum(refused)
    if skipped:
        keep = [i for i, r in enumerate(refused) if not r]
        rows, prompts = [rows[i] for i in keep], [prompts[i] for i in keep]
        uids, metas = [uids[i] for i in keep], [metas[i] for i in keep]
        if not rows:
            return {"skipped_overlong": skipped}
    # batches of similar prompt length (a batch prefills its longest prompt's width: SQL schema prompts
    # range from 500 to 1,600 tokens); greedy results do not depend on the order (up to float rounding)
    order = sorted(range(len(prompts)), key=lambda i: len(prompts[i]))
    prompts, uids, metas = [prompts[i] for i in order], [uids[i] for i in order], [metas[i] for i in order]
    reward = reward or make_reward(protocol.name)
    lab_rows = {r["id"]: r for r in rows if r.get("lab")}  # the lab's questions: role skills (lab.metrics)
    agent = Agent(cfg, tokenizer, protocol, tool_fn, SamplingConfig(temperature=temperature), rollout,
                  router_convention, mesh=mesh)

    def batch_sums(s: int) -> dict:
        sl = slice(s, s + batch)
        tb = rollout_policy(agent, base, adapters, prompts[sl], uids[sl], metas[sl], seed=seed + s)
        scored = reward.score(tb.reward_text, metas[sl], tb.observed)
        correct = task_accuracy(protocol.name, tb.reward_text, metas[sl], scored.scores)[scored.valid]
        return {"answer_rate": sum(f == "answer" for f in tb.finish_reason),
                "invalid_rate": sum(f == "invalid" for f in tb.finish_reason),
                "tool_calls": float(tb.tool_calls().sum()), "reward": float(scored.scores[scored.valid].sum()),
                "scored": int(scored.valid.sum()), "correct": int(correct.sum()),
                **({"example": tb.response_text[0]} if s == 0 else {}),
                **({"lab": batch_records(tb, lab_rows)} if lab_rows else {})}

    # per batch, in batch order: sums over its rows; batches dealt round-robin over processes
    parts = [p for round_ in rounds(list(range(0, len(rows), batch)))
             for p in gather_results(lambda r=round_: None if mine(r) is None else batch_sums(mine(r)))
             if p is not None]
    out = {"n": len(rows), **{k: sum(p[k] for p in parts) for k in ("answer_rate", "invalid_rate", "tool_calls",
                                                                   "reward", "scored", "correct")},
           "skipped_overlong": skipped}
    out["example"] = next(p["example"] for p in parts if "example" in p)
    for k in ("answer_rate", "invalid_rate", "tool_calls"):
        out[k] /= len(rows)
    out["reward"] = out["reward"] / out["scored"] if out["scored"] else float("nan")
    if lab_rows:
        out.update(finite(role_skills([rec for p in parts for rec in p.get("lab", [])], lab_rows)))
    return out


def task_accuracy(task: str, texts: list[str], metas: list[dict], scores: np.ndarray) -> np.ndarray:
    """Per-trajectory accuracy, whatever the reward shaping: QA = EM of the last <answer> of `texts` (reward
    texts: TrajectoryBatch.reward_text), SQL = execution match (every SQL shaping gives its maximum, +1,
    exactly then)."""
    if task == "qa":
        return np.asarray([em_reward(t, m["golden_answers"]) for t, m in zip(texts, metas)], np.float32)
    return (np.asarray(scores) > 0).astype(np.float32)
