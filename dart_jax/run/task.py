"""A run's task: its training and held-out rows and its tool, as the run spec says (`data.train`,
`eval`, `retriever` / `tool`). The task's reward is `rewards.training.make_reward`."""

from __future__ import annotations

from dart_jax.data.paths import REPO, repo_path
from dart_jax.data.readers import load_rows, merge
from dart_jax.rollout.agent import tool_for
from dart_jax.run.spec import RunSpec


def build_tool(spec: RunSpec, protocol):
    """The agent's tool function for `protocol` as the spec says."""
    return tool_for(protocol, make_tool(spec, protocol))


def make_tool(spec: RunSpec, protocol):
    """The raw tool: a SQLiteTool, or a RetrievalTool over the local index (dense or lexical:
    retriever.kind) / a retrieval server."""
    if protocol.name == "sql":
        from dart_jax.tools.sqlite_exec import SQLiteTool
        return SQLiteTool(timeout_s=float(spec.tool.sql_timeout_s))
    from dart_jax.tools.retrieval import RetrievalTool, Retriever, ensure_index
    rc = spec.retriever
    if rc.url:
        from dart_jax.tools.retrieval_server import RemoteRetriever
        searcher = RemoteRetriever(rc.url)
    elif rc.kind == "lexical":
        from dart_jax.tools.lexical import LexicalRetriever, ensure_lexical_index
        index = repo_path(rc.index_dir) if rc.index_dir else ensure_lexical_index(repo_path(rc.corpus))
        searcher = LexicalRetriever(index)
    else:
        index = repo_path(rc.index_dir) if rc.index_dir else ensure_index(repo_path(rc.corpus), rc.encoder)
        searcher = Retriever(index, query_prefix=rc.query_prefix or None, passage_prefix=rc.passage_prefix or None)
    return RetrievalTool(searcher, topk=int(rc.topk))


def load_eval_rows(spec: RunSpec) -> list[dict]:
    """The fixed held-out questions of `eval` (none when eval.n is 0)."""
    ec = spec.eval
    if not ec.n or not ec.data:
        return []
    rows = merge(*[load_rows(dict(entry), base_dir=REPO) for entry in ec.data])
    return rows[:int(ec.n)]


def load_task_rows(spec: RunSpec) -> list[dict]:
    if not spec.data_train:
        raise ValueError("config.data.train is empty: list the training datasets (see configs/base.py)")
    sets = [load_rows(dict(entry), base_dir=REPO) for entry in spec.data_train]
    rows = merge(*sets)
    if not rows:
        raise ValueError("config.data.train selected no rows")
    return rows
