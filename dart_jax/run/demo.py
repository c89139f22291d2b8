"""A scripted rollout on the embedded data: real model, real tools, real rewards, printed.

The embedded SmolLM2 never writes the protocol's tags on its own (every trajectory ends invalid), so
it starts from the shipped warm start of its task (`data/warm_start/smollm2-135m-nq` for QA,
`data/warm_start/smollm2-135m-spider` for NL2SQL, merged into the weights) unless told otherwise."""

from __future__ import annotations

import jax

from dart_jax.checkpoints.dart_io import import_dart
from dart_jax.checkpoints.registry import load_model, load_tagged_model
from dart_jax.data.paths import repo_path
from dart_jax.rewards.training import make_reward
from dart_jax.rollout.agent import Agent, RolloutConfig, tool_for
from dart_jax.rollout.protocol import PROTOCOLS
from dart_jax.rollout.sampling import SamplingConfig
from dart_jax.rollout.tasks import qa_rows, qa_task, spider_rows, sql_task
from dart_jax.run.policy import merge_warm_start
from dart_jax.tools.retrieval import RetrievalTool, Retriever, ensure_index
from dart_jax.tools.sqlite_exec import SQLiteTool

SHIPPED_WARM_STARTS = {("smollm2-135m-instruct", "qa"): "data/warm_start/smollm2-135m-nq",
                       ("smollm2-135m-instruct", "sql"): "data/warm_start/smollm2-135m-spider"}


def default_warm_start(model: str, task: str) -> str:
    """The shipped warm start for (model, task), or "" when none is shipped."""
    return SHIPPED_WARM_STARTS.get((model, task), "")


def run_rollout_demo(model: str, task: str = "qa", n: int = 4, adapters: str | None = None,
                     temperature: float = 1.0, max_turns: int = 2, max_tokens_per_turn: int = 128,
                     seed: int = 0, offset: int = 0, warm_start: str = "") -> tuple[object, list[float]]:
    """`warm_start`: a warm-start directory merged into the model first (see `default_warm_start`);
    `adapters`: a DART directory (trained on top of that warm start, if any)."""
    if adapters or warm_start:
        cfg, base = load_model(model)
        tok = None
        if warm_start:
            base, cfg, tok = merge_warm_start(repo_path(warm_start), base, cfg)
        ads = None
        if adapters:
            ads, _, base, cfg, tok = import_dart(adapters, base, cfg)
    else:
        ads = None
        cfg, base, tok = load_tagged_model(model, jax.random.PRNGKey(seed))
    protocol = PROTOCOLS[task]
    if task == "qa":
        tool = tool_for(protocol, RetrievalTool(Retriever(ensure_index())))
        prompts, uids, metas = qa_task(tok, qa_rows(n=n, offset=offset))
    else:
        tool = tool_for(protocol, SQLiteTool())
        prompts, uids, metas = sql_task(tok, spider_rows(n=n, offset=offset))
    rc = RolloutConfig(max_turns=max_turns, max_tokens_per_turn=max_tokens_per_turn,
                       max_response_tokens=max_tokens_per_turn * (max_turns + 2) + 600, max_obs_tokens=500,
                       invalid_action="search_r1", route_mode="role" if ads else "none")
    agent = Agent(cfg, tok, protocol, tool, SamplingConfig(temperature=temperature), rc)
    tb = agent.rollout(base, ads, prompts, uids, metas, seed=seed)
    return tb, [float(x) for x in make_reward(task).score(tb.reward_text, metas, tb.observed).scores]


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
