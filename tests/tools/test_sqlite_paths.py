"""Database paths and request writes of the SQL tool (issue 49, classes 6 and 7).

6: a database path goes into a `file:` URI percent-quoted: a name holding a space, `%20`, `#`, `?`
   or `&` opens exactly that file read-only; it never reads another file, never drops `mode=ro`,
   never creates a file. A missing file is an error observation, not a new empty database.
7: the request written to a worker obeys the caller's deadline: a large request to a stalled worker
   (its pipe full) comes back as a timeout error observation in time instead of blocking the caller.
"""

import os
import signal
import sqlite3
import threading
import time

import pytest

from dart_jax.tools.sqlite_exec import KILL_GRACE_S, SQLitePool, execute, execute_local, readonly_uri

# names that, pasted unquoted into `file:{path}?mode=ro`, read another file ("%20" decodes to a space),
# end the path at a fragment ("#": `mode=ro` dropped, the prefix created read-write) or start the query
# early ("?...&": `mode=rwc` replaces `mode=ro`, the prefix created read-write)
HOSTILE_NAMES = ["a b.sqlite", "a%20b.sqlite", "x#y.sqlite", "q?mode=rwc&z=.sqlite", "p%3Fmode=rwc.sqlite",
                 "h#?mode=rw", "uni ü%41.sqlite"]


def _make_db(path, marker):
    conn = sqlite3.connect(path)  # the test's own writable handle, not the tool's
    conn.execute("CREATE TABLE t (v TEXT)")
    conn.execute("INSERT INTO t VALUES (?)", (marker,))
    conn.commit()
    conn.close()


@pytest.fixture()
def dbdir(tmp_path):
    for name in HOSTILE_NAMES:
        _make_db(str(tmp_path / name), name)
    # decoys: the files an unquoted URI would open instead
    _make_db(str(tmp_path / "q"), "decoy q")
    return tmp_path


@pytest.mark.parametrize("name", HOSTILE_NAMES)
def test_hostile_names_read_that_file_and_create_nothing(dbdir, name):
    path = str(dbdir / name)
    before = sorted(os.listdir(dbdir))
    local = execute_local(path, "SELECT v FROM t", timeout_s=10.0)
    pooled = execute(path, "SELECT v FROM t", timeout_s=10.0)
    assert local.ok and local.rows == [(name,)], local
    assert pooled.ok and pooled.rows == [(name,)], pooled
    assert sorted(os.listdir(dbdir)) == before  # no "x", "h", "p?mode=rwc", journal, …


@pytest.mark.parametrize("name", HOSTILE_NAMES + ["q"])
def test_uri_is_read_only_for_every_name(dbdir, name):
    # the URI alone (no authorizer, no query_only) must give a handle that cannot write
    path = str(dbdir / name)
    conn = sqlite3.connect(readonly_uri(path), uri=True)
    try:
        assert conn.execute("SELECT count(*) FROM t").fetchone() == (1,)
        with pytest.raises(sqlite3.OperationalError, match="readonly"):
            conn.execute("CREATE TABLE w (a)")
    finally:
        conn.close()


@pytest.mark.parametrize("name", ["missing.sqlite", "missing?mode=rwc&z=", "missing#x", "q?mode=rwc&z=gone"])
def test_missing_database_is_an_error_and_never_created(dbdir, name):
    path = str(dbdir / name)
    before = sorted(os.listdir(dbdir))
    for res in (execute(path, "SELECT 1", timeout_s=10.0), execute_local(path, "SELECT 1", timeout_s=10.0)):
        assert not res.ok and "cannot open database" in res.error, res
    # opening the URI directly (a file removed between the check and the open) fails too
    with pytest.raises(sqlite3.OperationalError):
        sqlite3.connect(readonly_uri(path), uri=True).execute("SELECT 1")
    assert sorted(os.listdir(dbdir)) == before


# --- class 7: the request write obeys the deadline --------------------------------------------------

TIMEOUT = 1.0
# the caller must be back within its deadline + KILL_GRACE_S + MARGIN_S (MARGIN_S: scheduling on a
# loaded 2-core CI runner; the old blocking write never returned at all)
MARGIN_S = 1.0
BIG_SQL = "SELECT 1 -- " + "x" * (4 << 20)  # 4 MB: far more than a pipe buffer (64 kB by default on Linux)


def test_large_request_to_a_stalled_worker_times_out_in_time(dbdir):
    path = str(dbdir / "a b.sqlite")
    pool = SQLitePool(max_workers=1)
    try:
        pool.warm(1)
        assert pool.execute(path, "SELECT 1", timeout_s=10.0).rows == [(1,)]
        pid = pool.pids()[0]
        os.kill(pid, signal.SIGSTOP)  # the worker stops reading: its stdin pipe fills
        out = {}

        def call():
            t = time.monotonic()
            out["res"] = pool.execute(path, BIG_SQL, timeout_s=TIMEOUT)
            out["s"] = time.monotonic() - t

        caller = threading.Thread(target=call, daemon=True)
        caller.start()
        caller.join(TIMEOUT + KILL_GRACE_S + MARGIN_S)
        blocked = caller.is_alive()
        if blocked:  # the regression: unblock the caller (its write fails) so the test ends
            os.kill(pid, signal.SIGKILL)
            caller.join(10.0)
        assert not blocked, "the caller blocked writing to a stalled worker past its deadline"
        res = out["res"]
        assert res.error == "query timed out" and not res.transient, res
        assert out["s"] < TIMEOUT + KILL_GRACE_S + MARGIN_S
        assert pool.killed == 1 and pool.pids() == []  # the stalled worker was killed
        # the pool still works, and a large request to a live worker goes through in pieces
        res = pool.execute(path, "SELECT 1 -- " + "x" * 90_000, timeout_s=10.0)  # > 64 kB, < the SQL limit
        assert res.ok and res.rows == [(1,)], res
        res = pool.execute(path, BIG_SQL, timeout_s=10.0)  # over SQLite's SQL length limit: an error, in time
        assert not res.ok and res.error != "query timed out" and not res.transient, res
    finally:
        pool.close()
