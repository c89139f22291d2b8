"""Prompt builders: Search-R1 QA and SkyRL-SQL NL2SQL, as those projects write them."""

from __future__ import annotations

import os
import sqlite3
import urllib.parse
from typing import Callable

Mark = Callable[[str], str]  # wraps an untrusted value (tokenization.tokenizer.Untrusted)


def _same(value: str) -> str:
    return value

SEARCH_R1_TEMPLATE = (
    "Answer the given question. You must conduct reasoning inside <think> and </think> first every time you "
    "get new information. After reasoning, if you find you lack some knowledge, you can call a search engine "
    "by <search> query </search> and it will return the top searched results between <information> and "
    "</information>. You can search as many times as your want. If you find no further external knowledge "
    "needed, you can directly provide the answer inside <answer> and </answer>, without detailed "
    "illustrations. For example, <answer> Beijing </answer>. Question: {question}\n")

SQL_TEMPLATE = (
    "Task Overview:\nYou are a data science expert. Below, you are provided with a database schema and a natural "
    "language question. Your task is to understand the schema and generate a valid SQL query to answer the "
    "question within limited turns. You should breakdown the problem, draft your reasoning process, and generate "
    "the solution.\n\nDatabase Engine:\nSQLite\n\nDatabase Schema:\n{schema}\nThis schema describes the database's "
    "structure, including tables, columns, primary keys, foreign keys, and any relevant relationships or "
    "constraints.\n\nExternal Knowledge:\n{evidence}\n\nQuestion:\n{question}\n\nInstructions:\n"
    "- Make sure you only output the information that is asked in the question. If the question asks for a "
    "specific column, make sure to only include that column in the SELECT clause, nothing more.\n"
    "- The generated query should return all of the information asked in the question without any missing or "
    "extra information.\n- Before generating the final SQL query, please think through the steps of how to "
    "write the query. It should include detailed considerations such as analysing questions, summarizing "
    "relevant findings, brainstorming new ideas, verifying the accuracy of the current steps, refining any "
    "errors, thinking of how to call SQL tools, and revisiting previous steps.\n\nFormat:\n"
    "- Conduct thinking inside <think>...</think> blocks every time you get new observation or information.\n"
    "- You can use SQL tool written within a single <sql>your sql</sql> block to explore or verify. SQL tool "
    "output will be shown as dataframe inside <observation>...</observation>. Based on this observation, you "
    "can think again and refine.\n- The returned dataframe will be truncated in 50 rows if observation is too "
    "long.\n- If you find no further exploration is needed or reaches max turns, you MUST directly provide the "
    "final SQL query solution inside <solution>...</solution>.\n")


# the lab's prompt (dart_jax/lab): the same tags and tool in ~50 tokens instead of ~150; its worlds need no
# long instruction, and every token of a prompt is paid once per sample on 2 CPU cores
LAB_TEMPLATE = (
    "Answer the question. Reason inside <think> and </think>. To look up an entity, write <search> its name "
    "</search>; the passage comes back between <information> and </information>. Give the final answer inside "
    "<answer> and </answer>. Question: {question}\n")


def qa_question(question: str) -> str:
    """Search-R1: strip, append '?' if missing."""
    q = question.strip()
    return q if q.endswith("?") else q + "?"


def qa_prompt(question: str, mark: Mark = _same, template: str = SEARCH_R1_TEMPLATE) -> str:
    """Search-R1's prompt; `mark` wraps the question (dataset text, never trusted to hold tags)."""
    return template.format(question=mark(qa_question(question)))


def qa_row_prompt(row: dict, mark: Mark = _same) -> str:
    """A QA row's prompt: the lab's short one for a lab question (a row with a "lab" field, written by
    dart_jax.lab.questions), Search-R1's otherwise."""
    return qa_prompt(row["question"], mark, LAB_TEMPLATE if row.get("lab") else SEARCH_R1_TEMPLATE)


def schema_ddl(db_path: str) -> str:
    """CREATE TABLE statements (with keys) read from the SQLite file itself."""
    if not os.path.isfile(db_path):
        raise FileNotFoundError(f"SQLite database {db_path} not found")
    # the path percent-quoted as tools.sqlite_exec.readonly_uri does (that file runs its workers in
    # isolation and imports nothing of dart_jax): `#`, `?` or `%` in a name cannot drop mode=ro
    uri = f"file:{urllib.parse.quote(os.path.abspath(db_path), safe='/')}?mode=ro"
    conn = sqlite3.connect(uri, uri=True)
    try:
        rows = conn.execute("SELECT sql FROM sqlite_master WHERE type = 'table' AND sql IS NOT NULL "
                            "AND name NOT LIKE 'sqlite_%' ORDER BY rowid").fetchall()
    finally:
        conn.close()
    return "\n\n".join(r[0].strip() + ";" for r in rows)


def sql_prompt(question: str, db_path: str, evidence: str = "", mark: Mark = _same) -> str:
    """SkyRL-SQL's prompt; `mark` wraps the schema, evidence and question (dataset text)."""
    return SQL_TEMPLATE.format(schema=mark(schema_ddl(db_path)), evidence=mark(evidence or ""),
                               question=mark(question.strip()))
