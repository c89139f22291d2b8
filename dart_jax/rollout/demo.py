"""A scripted rollout on the embedded data: real model, real tools, real rewards, printed."""

from __future__ import annotations

import jax

from dart_jax.checkpoints.dart_io import import_dart
from dart_jax.checkpoints.registry import load_model
from dart_jax.rollout.agent import Agent, RolloutConfig, tool_for
from dart_jax.rollout.protocol import PROTOCOLS
from dart_jax.rollout.sampling import SamplingConfig
from dart_jax.rollout.tasks import qa_rows, qa_task, spider_rows, sql_task
from dart_jax.tokenization.tokenizer import load_tagged_model
from dart_jax.tools.retrieval import Retriever, RetrievalTool, ensure_index
from dart_jax.tools.sqlite_exec import SQLiteTool


def run_rollout_demo(model: str, task: str = "qa", n: int = 4, adapters: str | None = None,
                     temperature: float = 1.0, max_turns: int = 2, max_tokens_per_turn: int = 128,
                     seed: int = 0, offset: int = 0) -> tuple[object, list[float]]:
    if adapters:
        cfg, base = load_model(model)
        ads, _, base, cfg, tok = import_dart(adapters, base, cfg)
    else:
        ads = None
        cfg, base, tok = load_tagged_model(model, jax.random.PRNGKey(seed))
    protocol = PROTOCOLS[task]
    if task == "qa":
        tool = tool_for(protocol, RetrievalTool(Retriever(ensure_index())))
        prompts, uids, metas, reward = qa_task(tok, qa_rows(n=n, offset=offset))
    else:
        tool = tool_for(protocol, SQLiteTool())
        prompts, uids, metas, reward = sql_task(tok, spider_rows(n=n, offset=offset))
    rc = RolloutConfig(max_turns=max_turns, max_tokens_per_turn=max_tokens_per_turn,
                       max_response_tokens=max_tokens_per_turn * (max_turns + 2) + 600,
                       route_mode="role" if ads else "none")
    agent = Agent(cfg, tok, protocol, tool, SamplingConfig(temperature=temperature), rc)
    tb = agent.rollout(base, ads, prompts, uids, metas, seed=seed)
    rewards = [reward(tb.response_text[i], metas[i]) for i in range(tb.batch_size)]
    return tb, rewards


def describe(tb, rewards) -> str:
    out = []
    for i in range(tb.batch_size):
        out.append(f"=== {tb.uids[i]}  finish={tb.finish_reason[i]}  reward={rewards[i]:+.2f}  "
                   f"tool calls={int(tb.tool_calls()[i])}  response tokens={int(tb.length[i] - tb.prompt_len[i])} "
                   f"(sampled {int(tb.loss_mask[i].sum())})")
        for k, t in enumerate(tb.turns[i]):
            line = f"  turn {k}: {t['action']} ({t['tokens']} tokens)"
            if t["query"] is not None:
                line += f" query={t['query']!r}"
            out.append(line)
            if t["observation"]:
                out.append("    -> " + t["observation"][:300].replace("\n", "\n       "))
        out.append("  response: " + tb.response_text[i][:700].replace("\n", "\n  "))
    return "\n".join(out)
