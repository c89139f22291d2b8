"""Hardened read-only SQLite execution for the NL2SQL tool and the SQL rewards.

Defence in depth, each layer enough on its own for writes:
- the file is opened with a `mode=ro` URI (the OS-level handle cannot write), `PRAGMA query_only`;
- an authorizer denies ATTACH / DETACH, every write and schema change, PRAGMA assignments,
  and the load_extension() function (extension loading is also disabled on the connection);
- exactly one statement per call (sqlite3 refuses a second one);
- a progress handler aborts the statement at its deadline (endless recursive CTEs, huge joins);
- at most `max_rows` rows are fetched and the rendered text is capped at `max_chars`.
Errors come back as results (`error` set), never as exceptions: they become observations.
"""

from __future__ import annotations

import dataclasses
import os
import sqlite3
import time
from typing import Any

_ALLOWED = {
    sqlite3.SQLITE_SELECT, sqlite3.SQLITE_READ, sqlite3.SQLITE_FUNCTION, sqlite3.SQLITE_RECURSIVE,
}
_READ_PRAGMAS = {"table_info", "table_xinfo", "table_list", "index_list", "index_info", "index_xinfo",
                 "foreign_key_list", "collation_list"}
_DENIED_FUNCTIONS = {"load_extension", "readfile", "writefile", "edit", "fts3_tokenizer"}


@dataclasses.dataclass
class QueryResult:
    columns: list[str]
    rows: list[tuple]
    truncated: bool = False
    error: str | None = None
    seconds: float = 0.0

    @property
    def ok(self) -> bool:
        return self.error is None


def _authorizer(action, arg1, arg2, dbname, source):
    if action == sqlite3.SQLITE_FUNCTION and (arg2 or "").lower() in _DENIED_FUNCTIONS:
        return sqlite3.SQLITE_DENY
    if action == sqlite3.SQLITE_PRAGMA:
        # schema-reading pragmas (table_info, foreign_key_list, …) only; every other pragma can
        # change connection state (query_only, journal_mode, …) and is denied
        return sqlite3.SQLITE_OK if (arg1 or "").lower() in _READ_PRAGMAS else sqlite3.SQLITE_DENY
    return sqlite3.SQLITE_OK if action in _ALLOWED else sqlite3.SQLITE_DENY


def connect_readonly(path: str) -> sqlite3.Connection:
    if not os.path.isfile(path):
        raise FileNotFoundError(f"SQLite database {path} not found")
    conn = sqlite3.connect(f"file:{os.path.abspath(path)}?mode=ro", uri=True, check_same_thread=False,
                           isolation_level=None)
    conn.execute("PRAGMA query_only = ON")
    if hasattr(conn, "enable_load_extension"):  # absent when Python was built without it
        conn.enable_load_extension(False)
    conn.set_authorizer(_authorizer)
    return conn


def execute(path: str, sql: str, timeout_s: float = 5.0, max_rows: int = 1000) -> QueryResult:
    """Run one read-only statement with a deadline. Never raises for bad SQL."""
    t0 = time.monotonic()
    sql = (sql or "").strip()
    if not sql:
        return QueryResult([], [], error="empty query")
    try:
        conn = connect_readonly(path)
    except (FileNotFoundError, sqlite3.Error) as e:
        return QueryResult([], [], error=f"cannot open database: {e}")
    deadline = t0 + timeout_s
    conn.set_progress_handler(lambda: 1 if time.monotonic() > deadline else 0, 1000)
    try:
        cur = conn.execute(sql)
        columns = [d[0] for d in cur.description or []]
        rows = cur.fetchmany(max_rows + 1)
        truncated = len(rows) > max_rows
        return QueryResult(columns, [tuple(r) for r in rows[:max_rows]], truncated, None, time.monotonic() - t0)
    except sqlite3.OperationalError as e:
        msg = "query timed out" if "interrupted" in str(e) else str(e)
        return QueryResult([], [], error=msg, seconds=time.monotonic() - t0)
    except (sqlite3.Error, sqlite3.Warning, ValueError, OverflowError, MemoryError) as e:
        return QueryResult([], [], error=f"{type(e).__name__}: {e}", seconds=time.monotonic() - t0)
    finally:
        try:
            conn.rollback()
        finally:
            conn.close()


def _cell(v: Any, width: int = 64) -> str:
    s = "NULL" if v is None else (v.hex() if isinstance(v, bytes) else str(v))
    s = s.replace("\n", " ").replace("|", "/")
    return s if len(s) <= width else s[: width - 1] + "…"


def render_table(res: QueryResult, max_rows: int = 50, max_chars: int = 4000) -> str:
    """A markdown-style table, at most `max_rows` rows and `max_chars` characters; errors as text."""
    if not res.ok:
        return f"Error: {res.error}"
    if not res.columns:
        return "Query executed; it returned no columns."
    lines = ["| " + " | ".join(_cell(c) for c in res.columns) + " |"]
    for row in res.rows[:max_rows]:
        lines.append("| " + " | ".join(_cell(v) for v in row) + " |")
    if len(res.rows) > max_rows or res.truncated:
        lines.append(f"... (showing the first {min(max_rows, len(res.rows))} rows)")
    if not res.rows:
        lines.append("(no rows)")
    text = "\n".join(lines)
    if len(text) > max_chars:
        text = text[: max_chars - 20].rsplit("\n", 1)[0] + "\n... (truncated)"
    return text


class SQLiteTool:
    """The <sql> tool: one database per call (`db_paths[i]` for query i)."""

    def __init__(self, timeout_s: float = 5.0, max_rows: int = 50, max_chars: int = 4000):
        self.timeout_s, self.max_rows, self.max_chars = timeout_s, max_rows, max_chars

    def batch(self, queries: list[str], db_paths: list[str]) -> list[str]:
        return [render_table(execute(db, q, self.timeout_s, self.max_rows + 1), self.max_rows, self.max_chars)
                for q, db in zip(queries, db_paths)]
