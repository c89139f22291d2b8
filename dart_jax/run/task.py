"""A run's task: its training and held-out rows and its tool, as the config says (`data.train`,
`eval`, `retriever` / `tool`). The task's reward is `rewards.training.make_reward`."""

from __future__ import annotations

from dart_jax.data.paths import REPO, repo_path
from dart_jax.data.readers import load_rows, merge
from dart_jax.rollout.agent import tool_for


def build_tool(config, protocol):
    """The agent's tool function for `protocol` as `config` says."""
    return tool_for(protocol, make_tool(config, protocol))


def make_tool(config, protocol):
    """The raw tool: a SQLiteTool, or a RetrievalTool over the local index / a retrieval server."""
    if protocol.name == "sql":
        from dart_jax.tools.sqlite_exec import SQLiteTool
        return SQLiteTool(timeout_s=float(config.tool.sql_timeout_s))
    from dart_jax.tools.retrieval import RetrievalTool, Retriever, ensure_index
    rc = config.retriever
    if rc.url:
        from dart_jax.tools.retrieval_server import RemoteRetriever
        searcher = RemoteRetriever(rc.url)
    else:
        index = repo_path(rc.index_dir) if rc.index_dir else ensure_index(repo_path(rc.corpus), rc.encoder)
        searcher = Retriever(index, query_prefix=rc.get("query_prefix") or None,
                             passage_prefix=rc.get("passage_prefix") or None)
    return RetrievalTool(searcher, topk=int(rc.topk))


def load_eval_rows(config) -> list[dict]:
    """The fixed held-out questions of `config.eval` (none when eval.n is 0)."""
    ec = config.get("eval")
    if not ec or not ec.n or not ec.data:
        return []
    rows = merge(*[load_rows(dict(spec), base_dir=REPO) for spec in ec.data])
    return rows[:int(ec.n)]


def load_task_rows(config) -> list[dict]:
    if not config.data.train:
        raise ValueError("config.data.train is empty: list the training datasets (see configs/base.py)")
    sets = [load_rows(dict(spec), base_dir=REPO) for spec in config.data.train]
    rows = merge(*sets)
    if not rows:
        raise ValueError("config.data.train selected no rows")
    return rows
