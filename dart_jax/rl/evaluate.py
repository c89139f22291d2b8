"""Held-out rollouts during training: does the policy follow the protocol, and how often is it right?

Shared by the SFT protocol check (before / after the warm start) and the GRPO trainer's periodic
evaluation (`config.eval`): the same agent, tool and rewards as training, on questions training
never sees, greedy by default (temperature 0), so the numbers move only when the policy does.
"""

from __future__ import annotations

from dart_jax.rollout.agent import Agent, RolloutConfig
from dart_jax.rollout.sampling import SamplingConfig
from dart_jax.rollout.tasks import qa_task, sql_task


def rollout_eval(cfg, tokenizer, protocol, tool_fn, rollout: RolloutConfig, router_convention: str, base, adapters,
                 rows: list[dict], temperature: float = 0.0, batch: int = 8, seed: int = 0) -> dict:
    """-> {n, answer_rate, invalid_rate, tool_calls, reward, example} over `rows` (task rows; rows
    without a reference — demonstrations from a file may have none — are skipped)."""
    need = ("db_path", "query") if protocol.name == "sql" else ("golden_answers",)
    rows = [r for r in rows if all(r.get(k) for k in need)]
    if not rows:
        return {}
    task_fn = sql_task if protocol.name == "sql" else qa_task
    prompts, uids, metas, reward_fn = task_fn(tokenizer, rows)
    agent = Agent(cfg, tokenizer, protocol, tool_fn, SamplingConfig(temperature=temperature), rollout,
                  router_convention)
    out = {"n": len(rows), "answer_rate": 0.0, "invalid_rate": 0.0, "tool_calls": 0.0, "reward": 0.0}
    for s in range(0, len(rows), batch):
        tb = agent.rollout(base, adapters, prompts[s:s + batch], uids[s:s + batch], metas[s:s + batch], seed=seed + s)
        out["answer_rate"] += sum(f == "answer" for f in tb.finish_reason)
        out["invalid_rate"] += sum(f == "invalid" for f in tb.finish_reason)
        out["tool_calls"] += float(tb.tool_calls().sum())
        out["reward"] += sum(reward_fn(tb.response_text[i], metas[s + i]) for i in range(tb.batch_size))
        if s == 0:
            out["example"] = tb.response_text[0]
    for k in ("answer_rate", "invalid_rate", "tool_calls", "reward"):
        out[k] /= len(rows)
    return out
