"""Hardened read-only SQLite execution for the NL2SQL tool and the SQL rewards.

Defence in depth, each layer enough on its own for writes:
- the file is opened with a `mode=ro` URI (the OS-level handle cannot write, a missing file is an
  error, never a new database), `PRAGMA query_only`; the path is percent-quoted into the URI, so a
  name holding `%`, `#`, `?` or `&` names that file and cannot drop or replace `mode=ro`;
- an authorizer denies ATTACH / DETACH, every write and schema change, PRAGMA assignments,
  and the load_extension() function (extension loading is also disabled on the connection);
- exactly one statement per call (sqlite3 refuses a second one);
- a progress handler aborts the statement at its deadline (endless recursive CTEs, huge joins);
- per-connection limits (`LIMITS`: 1 MB per string / blob, 100 kB of SQL, expression depth, …) so a
  value such as `randomblob(1e9)` or `s || s` growth fails at once instead of allocating gigabytes;
- at most `max_rows` rows and `max_result_bytes` bytes are fetched, and rendering never
  materialises more of a value than the cell it fills;
- every statement runs in a worker process (`SQLitePool`) under an address-space limit, killed at
  deadline + `KILL_GRACE_S`: one SQLite function call (printf padding, a pathological LIKE) cannot
  be interrupted by the progress handler, a process can. A killed worker is replaced. Both the
  request's write and the reply's read obey the caller's deadline (a stalled worker with a full
  pipe cannot block the caller).
- no statement uses disk: `PRAGMA temp_store = MEMORY` keeps the sorter (ORDER BY / GROUP BY /
  DISTINCT) and every temp b-tree (DISTINCT, UNION, recursive-CTE queues, materialised subqueries)
  in the worker's memory, where SQLite's heap limit (`SQLITE_HEAP_MB`, inside the address-space
  limit) makes a runaway one an "out of memory" error, and a kill frees it. (With file temp storage
  a recursive DISTINCT ... ORDER BY held 1.6 GiB of unlinked temp files in 5 s.) The worker's
  RLIMIT_FSIZE / RLIMIT_NOFILE (`WORKER_FILE_MB` per file, `WORKER_FILES` open) bound what any file
  write could still take; SIGXFSZ is ignored, so a write past it is an error, not a kill.
Errors come back as results (`error` set), never as exceptions: they become observations.

This file imports only the standard library: the worker runs it as a script (`--worker`).
"""

from __future__ import annotations

import atexit
import dataclasses
import io
import os
import pickle
import queue
import resource
import selectors
import signal
import sqlite3
import struct
import subprocess
import sys
import threading
import time
import urllib.parse
from typing import Any

_ALLOWED = {
    sqlite3.SQLITE_SELECT, sqlite3.SQLITE_READ, sqlite3.SQLITE_FUNCTION, sqlite3.SQLITE_RECURSIVE,
}
_READ_PRAGMAS = {"table_info", "table_xinfo", "table_list", "index_list", "index_info", "index_xinfo",
                 "foreign_key_list", "collation_list"}
_DENIED_FUNCTIONS = {"load_extension", "readfile", "writefile", "edit", "fts3_tokenizer"}

# sqlite3_limit caps per connection. LENGTH bounds every string / blob / record a query can build
# (randomblob, zeroblob, replace, printf, group_concat, ||), so memory per value is bounded.
LIMITS = {
    sqlite3.SQLITE_LIMIT_LENGTH: 1_000_000,
    sqlite3.SQLITE_LIMIT_SQL_LENGTH: 100_000,
    sqlite3.SQLITE_LIMIT_COLUMN: 1000,
    sqlite3.SQLITE_LIMIT_EXPR_DEPTH: 200,
    sqlite3.SQLITE_LIMIT_COMPOUND_SELECT: 100,
    sqlite3.SQLITE_LIMIT_LIKE_PATTERN_LENGTH: 1000,
    sqlite3.SQLITE_LIMIT_ATTACHED: 0,
}
MAX_RESULT_BYTES = 16 << 20  # what one call may fetch (values + per-row overhead estimate)
# address-space limit of a worker process (its own baseline is ~20 MB); DART_JAX_SQL_WORKER_MB overrides
WORKER_MEMORY_MB = int(os.environ.get("DART_JAX_SQL_WORKER_MB", "200"))
KILL_GRACE_S = 0.3           # a worker still busy this long after the deadline is killed
# SQLite's own heap in a worker (page cache, sorter, in-memory temp b-trees): a statement past it fails
# with "out of memory" while the worker keeps the rest of its address space for Python
SQLITE_HEAP_MB = WORKER_MEMORY_MB // 2
# disk backstop in a worker: no file it writes grows past WORKER_FILE_MB (a WAL database's -shm index
# is 32 kB), and it holds at most WORKER_FILES descriptors; temp storage is in memory, so this is unused
WORKER_FILE_MB = 1
WORKER_FILES = 64


@dataclasses.dataclass
class QueryResult:
    columns: list[str]
    rows: list[tuple]
    truncated: bool = False
    error: str | None = None
    seconds: float = 0.0
    transient: bool = False  # the error says nothing about the query (a worker died, every worker was busy)

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


def readonly_uri(path: str) -> str:
    """The `file:` URI that opens `path` read-only: every character of the absolute path other than
    `/` and unreserved ones is percent-quoted (`%`, `#`, `?`, `&`, spaces, non-ASCII as UTF-8), so
    the name cannot end the path, start a query or fragment, or decode to another file."""
    return f"file:{urllib.parse.quote(os.path.abspath(path), safe='/')}?mode=ro"


def connect_readonly(path: str) -> sqlite3.Connection:
    if not os.path.isfile(path):
        raise FileNotFoundError(f"SQLite database {path} not found")
    conn = sqlite3.connect(readonly_uri(path), uri=True, check_same_thread=False, isolation_level=None)
    conn.execute("PRAGMA query_only = ON")
    # sorter spills and temp b-trees stay in memory (bounded by the heap / address-space limit), never on disk
    conn.execute("PRAGMA temp_store = MEMORY")
    if hasattr(conn, "enable_load_extension"):  # absent when Python was built without it
        conn.enable_load_extension(False)
    if hasattr(conn, "setlimit"):  # Python >= 3.11
        for limit, value in LIMITS.items():
            conn.setlimit(limit, value)
    conn.set_authorizer(_authorizer)
    return conn


def _size(v: Any) -> int:
    return len(v) if isinstance(v, (str, bytes)) else 8


def execute_local(path: str, sql: str, timeout_s: float = 5.0, max_rows: int = 1000,
                  max_result_bytes: int = MAX_RESULT_BYTES, clip_values: int | None = None) -> QueryResult:
    """Run one read-only statement in this process with a deadline. Never raises for bad SQL.
    A single long SQLite function call can overrun the deadline here; `execute` cannot."""
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
        rows, nbytes, truncated = [], 0, False
        for row in cur:
            nbytes += 64 + sum(_size(v) + 16 for v in row)
            if len(rows) >= max_rows or nbytes > max_result_bytes:
                truncated = True
                break
            if clip_values is not None:  # display only: keep what a rendered cell can show
                row = [v[:clip_values] if isinstance(v, (str, bytes)) else v for v in row]
            rows.append(tuple(row))
        return QueryResult(columns, rows, truncated, None, time.monotonic() - t0)
    except sqlite3.OperationalError as e:
        msg = "query timed out" if "interrupted" in str(e) else str(e)
        return QueryResult([], [], error=msg, seconds=time.monotonic() - t0)
    except MemoryError:  # in a worker: SQLite's heap limit (sorts and temp tables are in memory) or RLIMIT_AS
        return QueryResult([], [], error="out of memory: the statement's sorts, temporary tables or rows outgrew "
                                         "the SQL worker's memory cap", seconds=time.monotonic() - t0)
    except (sqlite3.Error, sqlite3.Warning, ValueError, OverflowError) as e:
        return QueryResult([], [], error=f"{type(e).__name__}: {e}", seconds=time.monotonic() - t0)
    finally:
        try:
            conn.rollback()
        finally:
            conn.close()


# --- worker processes ---------------------------------------------------------------------------

_HEADER = struct.Struct("<Q")


class _PlainUnpickler(pickle.Unpickler):
    """Results hold only None / int / float / str / bytes in lists and tuples: no class may load."""

    def find_class(self, module, name):
        raise pickle.UnpicklingError(f"SQL worker reply names {module}.{name}; only plain values are allowed")


def _lower_limit(which: int, value: int) -> None:
    """Set soft and hard `which` to `value`, or keep a hard limit that is already lower."""
    hard = resource.getrlimit(which)[1]
    value = value if hard == resource.RLIM_INFINITY else min(value, hard)
    resource.setrlimit(which, (value, value))


def _worker_main() -> None:
    limit = WORKER_MEMORY_MB << 20
    resource.setrlimit(resource.RLIMIT_AS, (limit, limit))
    signal.signal(signal.SIGXFSZ, signal.SIG_IGN)  # a write past RLIMIT_FSIZE fails (EFBIG) instead of killing
    _lower_limit(resource.RLIMIT_FSIZE, WORKER_FILE_MB << 20)
    _lower_limit(resource.RLIMIT_NOFILE, WORKER_FILES)
    conn = sqlite3.connect(":memory:")
    conn.execute(f"PRAGMA hard_heap_limit = {SQLITE_HEAP_MB << 20}")  # process-wide (sqlite3_hard_heap_limit64)
    conn.close()
    stdin, stdout = sys.stdin.buffer, sys.stdout.buffer
    while True:
        header = stdin.read(_HEADER.size)
        if len(header) < _HEADER.size:
            return  # the parent went away
        request = pickle.loads(stdin.read(_HEADER.unpack(header)[0]))
        try:
            res = execute_local(**request)
            reply = (res.columns, res.rows, res.truncated, res.error, res.seconds)
            payload = pickle.dumps(reply, protocol=pickle.HIGHEST_PROTOCOL)
        except MemoryError:
            payload = pickle.dumps(([], [], False, "out of memory", 0.0))
        stdout.write(_HEADER.pack(len(payload)) + payload)
        stdout.flush()


class _Worker:
    def __init__(self):
        # an LD_PRELOADed allocator (tcmalloc / jemalloc, common in accelerator images) reserves more
        # address space than the worker's limit: the worker runs with the system allocator
        env = {k: v for k, v in os.environ.items() if k != "LD_PRELOAD"}
        self.proc = subprocess.Popen([sys.executable, "-I", os.path.abspath(__file__), "--worker"],
                                     stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL,
                                     close_fds=True, env=env)
        # requests are written with os.write under the caller's deadline: a worker that stopped
        # reading (stalled, stopped, still starting) fills the pipe, and a blocking write would wait
        os.set_blocking(self.proc.stdin.fileno(), False)

    def _send(self, data: bytes, deadline: float) -> bool:
        """Write all of `data` to the worker by `deadline`; False if it could not (the caller kills)."""
        fd, view = self.proc.stdin.fileno(), memoryview(data)
        with selectors.DefaultSelector() as sel:
            sel.register(fd, selectors.EVENT_WRITE)
            while view:
                left = deadline - time.monotonic()
                if left <= 0 or not sel.select(left):
                    return False
                try:
                    view = view[os.write(fd, view):]
                except BlockingIOError:
                    continue
                except OSError:  # BrokenPipeError: the worker is gone
                    return False
        return True

    def ask(self, request: dict, deadline: float) -> tuple | None:
        """Send one request; the reply, or None if it could not be sent or none came by `deadline`
        (the caller kills)."""
        payload = pickle.dumps(request)
        if not self._send(_HEADER.pack(len(payload)) + payload, deadline):
            return None
        fd, buf, need = self.proc.stdout.fileno(), bytearray(), None
        with selectors.DefaultSelector() as sel:  # epoll / poll: no FD_SETSIZE limit
            sel.register(fd, selectors.EVENT_READ)
            while need is None or len(buf) < need:
                left = deadline - time.monotonic()
                if left <= 0 or not sel.select(left):
                    return None
                chunk = os.read(fd, 1 << 20)
                if not chunk:
                    return None  # the worker died (e.g. killed by the OS)
                buf += chunk
                if need is None and len(buf) >= _HEADER.size:
                    need = _HEADER.size + _HEADER.unpack_from(buf)[0]
        return _PlainUnpickler(io.BytesIO(bytes(buf[_HEADER.size:need]))).load()

    def kill(self) -> None:
        self.proc.kill()
        self.proc.wait()
        for f in (self.proc.stdin, self.proc.stdout):
            try:
                f.close()
            except OSError:
                pass


class SQLitePool:
    """Worker processes that run `execute_local`, at most `max_workers` at once. A call waits for a
    free worker inside its own deadline; a worker that overruns is killed and replaced on demand."""

    def __init__(self, max_workers: int = 32):
        self.max_workers = max_workers
        self._idle: queue.LifoQueue[_Worker] = queue.LifoQueue()
        self._slots = threading.Semaphore(max_workers)
        self._lock = threading.Lock()
        self._all: set[_Worker] = set()
        self.killed = 0

    def _spawn(self) -> _Worker:
        w = _Worker()
        with self._lock:
            self._all.add(w)
        return w

    def warm(self, n: int | None = None) -> None:
        for _ in range(min(n or self.max_workers, self.max_workers) - self._idle.qsize()):
            self._idle.put(self._spawn())

    def _discard(self, w: _Worker) -> None:
        w.kill()
        with self._lock:
            self._all.discard(w)

    def execute(self, path: str, sql: str, timeout_s: float = 5.0, max_rows: int = 1000,
                max_result_bytes: int = MAX_RESULT_BYTES, clip_values: int | None = None) -> QueryResult:
        t0 = time.monotonic()
        deadline = t0 + timeout_s
        if not (sql or "").strip():
            return QueryResult([], [], error="empty query")
        if not self._slots.acquire(timeout=timeout_s):
            return QueryResult([], [], error=f"every SQL worker was busy for {timeout_s} s", seconds=timeout_s,
                               transient=True)
        try:
            try:
                w = self._idle.get_nowait()
            except queue.Empty:
                w = self._spawn()
            if w.proc.poll() is not None:
                self._discard(w)
                w = self._spawn()
            request = dict(path=path, sql=sql, timeout_s=max(0.0, deadline - time.monotonic()), max_rows=max_rows,
                           max_result_bytes=max_result_bytes, clip_values=clip_values)
            try:
                reply = w.ask(request, deadline + KILL_GRACE_S)
            except Exception as e:  # noqa: BLE001 — a reply that cannot be read: this worker is done
                self._discard(w)
                return QueryResult([], [], error=f"unreadable SQL worker reply: {type(e).__name__}: {e}",
                                   seconds=time.monotonic() - t0, transient=True)
            if reply is None:
                died = w.proc.poll()
                self._discard(w)
                if died is not None:  # it exited on its own (killed by the OS, failed to start): not the query's fault
                    return QueryResult([], [], error=f"the SQL worker died (exit status {died}; if every worker "
                                             f"dies, its {WORKER_MEMORY_MB} MB address-space limit may be too small "
                                             "here: DART_JAX_SQL_WORKER_MB)",
                                       seconds=time.monotonic() - t0, transient=True)
                self.killed += 1
                return QueryResult([], [], error="query timed out", seconds=time.monotonic() - t0)
            self._idle.put(w)
            columns, rows, truncated, error, _ = reply
            return QueryResult(columns, rows, truncated, error, time.monotonic() - t0)
        finally:
            self._slots.release()

    def close(self) -> None:
        with self._lock:
            workers, self._all = list(self._all), set()
        for w in workers:
            w.kill()
        while not self._idle.empty():
            self._idle.get_nowait()

    def pids(self) -> list[int]:
        with self._lock:
            return [w.proc.pid for w in self._all]


_POOL: SQLitePool | None = None
_POOL_LOCK = threading.Lock()


def default_pool() -> SQLitePool:
    global _POOL
    with _POOL_LOCK:
        if _POOL is None:
            _POOL = SQLitePool()
            atexit.register(_POOL.close)
        return _POOL


def execute(path: str, sql: str, timeout_s: float = 5.0, max_rows: int = 1000,
            max_result_bytes: int = MAX_RESULT_BYTES, clip_values: int | None = None) -> QueryResult:
    """Run one read-only statement in a worker process; returns within timeout_s + KILL_GRACE_S
    (plus the reply's transfer) whatever the statement does. Never raises for bad SQL.
    `clip_values` cuts strings / blobs to that many characters / bytes (for display only)."""
    if not os.path.isfile(path):
        return QueryResult([], [], error=f"cannot open database: SQLite database {path} not found")
    return default_pool().execute(path, sql, timeout_s, max_rows, max_result_bytes, clip_values)


# --- rendering ----------------------------------------------------------------------------------

CELL_WIDTH = 64


def _cell(v: Any, width: int = CELL_WIDTH) -> str:
    if v is None:
        s = "NULL"
    elif isinstance(v, bytes):
        s = v[: width // 2 + 1].hex()  # never hex more than the cell shows
    else:
        s = v[: width + 1] if isinstance(v, str) else str(v)
    s = s.replace("\n", " ").replace("|", "/")
    long = len(s) > width or (isinstance(v, bytes) and 2 * len(v) > width)
    return s[: width - 1] + "…" if long else s


def render_table(res: QueryResult, max_rows: int = 50, max_chars: int = 4000) -> str:
    """A markdown-style table, at most `max_rows` rows and `max_chars` characters; errors as text."""
    if not res.ok:
        return f"Error: {res.error}"
    if not res.columns:
        return "Query executed; it returned no columns."
    lines, size = [], 0
    for cells in [res.columns, *res.rows[:max_rows]]:
        line = "| " + " | ".join(_cell(c) for c in cells) + " |"
        lines.append(line)
        size += len(line) + 1
        if size > max_chars:
            break
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
        return [render_table(execute(db, q, self.timeout_s, self.max_rows + 1, clip_values=CELL_WIDTH + 1),
                             self.max_rows, self.max_chars)
                for q, db in zip(queries, db_paths)]


if __name__ == "__main__" and sys.argv[1:] == ["--worker"]:
    _worker_main()
