"""Hostile SQL against a real Spider database: the file never changes, every call returns an
error observation within timeout + 0.5 s."""

import hashlib
import os
import shutil
import time

import pytest

from dart_jax.tools.sqlite_exec import MAX_RESULT_BYTES, SQLiteTool, execute, render_table

DB = os.path.join(os.path.dirname(__file__), "..", "..", "data", "spider", "database", "concert_singer",
                  "concert_singer.sqlite")
TIMEOUT = 1.0

HOSTILE = [
    "INSERT INTO singer (Singer_ID, Name) VALUES (99, 'x')",
    "UPDATE singer SET Name = 'x'",
    "DELETE FROM singer",
    "DROP TABLE singer",
    "CREATE TABLE t (a)",
    "ALTER TABLE singer ADD COLUMN z",
    "ATTACH DATABASE '/tmp/evil.db' AS evil",
    "SELECT load_extension('/tmp/evil.so')",
    "PRAGMA query_only = OFF",
    "PRAGMA journal_mode = WAL",
    "WITH RECURSIVE r(i) AS (SELECT 1 UNION ALL SELECT i + 1 FROM r) SELECT count(*) FROM r",
    "SELECT count(*) FROM singer a, singer b, singer c, singer d, singer e, singer f, singer g, singer h, "
    "singer i, singer j, singer k, singer l WHERE a.Age + b.Age + c.Age + l.Age > 0",
    "SELECT 1; DROP TABLE singer",
    "SELECT * FROM singer; SELECT 2",
    "VACUUM",
    "SELECT * FROM no_such_table",
    "SELEC nonsense",
    "",
]


@pytest.fixture()
def db(tmp_path):
    path = tmp_path / "concert_singer.sqlite"
    shutil.copy(DB, path)
    return str(path)


def digest(path):
    return hashlib.sha256(open(path, "rb").read()).hexdigest()


@pytest.mark.parametrize("sql", HOSTILE)
def test_hostile_query_is_an_error_in_time_and_never_writes(db, sql):
    before = digest(db)
    t = time.monotonic()
    res = execute(db, sql, timeout_s=TIMEOUT)
    assert time.monotonic() - t < TIMEOUT + 0.5
    assert not res.ok, (sql, res)
    assert render_table(res).startswith("Error: ")
    assert digest(db) == before
    assert sorted(os.listdir(os.path.dirname(db))) == ["concert_singer.sqlite"]  # no journal / wal files


def test_reads_work_and_render_as_table(db):
    res = execute(db, "SELECT Name, Age FROM singer ORDER BY Age DESC", timeout_s=TIMEOUT)
    assert res.ok and res.columns == ["Name", "Age"] and len(res.rows) == 6
    assert res.rows[0] == ("Joe Sharp", 52)
    text = render_table(res)
    assert text.splitlines()[0] == "| Name | Age |" and "| Joe Sharp | 52 |" in text
    assert execute(db, "PRAGMA table_info(singer)").ok  # schema reads are allowed


def test_row_and_char_caps(db):
    res = execute(db, "WITH RECURSIVE r(i) AS (SELECT 1 UNION ALL SELECT i + 1 FROM r LIMIT 500) SELECT i FROM r",
                  max_rows=100)
    assert res.ok and res.truncated and len(res.rows) == 100
    text = render_table(res, max_rows=50)
    assert text.count("\n") == 51 and "first 50 rows" in text
    assert len(render_table(res, max_rows=50, max_chars=120)) <= 120


def test_huge_sorted_cross_join_returns_in_time(db):
    t = time.monotonic()
    res = execute(db, "SELECT a.Name, i.Name FROM singer a, singer b, singer c, singer d, singer e, singer f, "
                      "singer g, singer h, singer i ORDER BY random()", timeout_s=TIMEOUT, max_rows=10)
    assert time.monotonic() - t < TIMEOUT + 0.5
    # a sort outgrowing the worker's in-memory temp storage is an "out of memory" error (never a disk spill)
    assert res.error == "query timed out" or (res.error or "").startswith("out of memory") or \
        (res.truncated and len(res.rows) == 10)


def test_tool_batch_and_missing_database(db, tmp_path):
    out = SQLiteTool(timeout_s=TIMEOUT).batch(["SELECT count(*) FROM singer", "DROP TABLE singer"],
                                              [db, db])
    assert out[0] == "| count(*) |\n| 6 |" and out[1].startswith("Error: ")
    assert execute(str(tmp_path / "nope.sqlite"), "SELECT 1").error.startswith("cannot open database")


# Memory bombs: each built a gigabyte-sized value or spun inside one uninterruptible SQLite call
# (randomblob(1e9) took 11 s and 2.9 GB before connection limits and worker processes).
MEMORY_BOMBS = [
    "SELECT randomblob(1000000000)",
    "SELECT zeroblob(1000000000)",
    "SELECT printf('%.*c', 1000000000, 'x')",
    "SELECT format('%.*c', 1000000000, 'x')",
    "SELECT replace(hex(zeroblob(400000)), '0', 'aaaa')",
    "WITH RECURSIVE r(s) AS (SELECT 'x' UNION ALL SELECT s || s FROM r) SELECT length(s) FROM r",
    ("WITH RECURSIVE r(i) AS (SELECT 1 UNION ALL SELECT i + 1 FROM r LIMIT 10000000) "
     "SELECT group_concat(hex(randomblob(100))) FROM r"),
    "WITH RECURSIVE r(i) AS (SELECT 1 UNION ALL SELECT i + 1 FROM r) SELECT i, randomblob(900000) FROM r",
    ("WITH RECURSIVE r(i, b) AS (SELECT 1, randomblob(900000) UNION ALL SELECT i + 1, randomblob(900000) FROM r) "
     "SELECT * FROM r ORDER BY b"),
    "SELECT " + ", ".join(["randomblob(999999)"] * 900),
    "SELECT " + "(" * 5000 + "1" + ")" * 5000,
    "SELECT " + " + ".join(["(1"] * 300) + ")" * 300,
    "SELECT hex(zeroblob(499999)) GLOB '*" + "0*" * 2000 + "1'",
]


def result_bytes(res):
    return sum(len(v) if isinstance(v, (str, bytes)) else 8 for row in res.rows for v in row)


@pytest.mark.parametrize("sql", MEMORY_BOMBS, ids=range(len(MEMORY_BOMBS)))
def test_memory_bomb_is_bounded_in_time_and_size_and_never_writes(db, sql):
    before = digest(db)
    t = time.monotonic()
    res = execute(db, sql, timeout_s=TIMEOUT)
    text = SQLiteTool(timeout_s=TIMEOUT).batch([sql], [db])[0]
    assert time.monotonic() - t < 2 * (TIMEOUT + 0.5)  # two calls
    assert res.seconds < TIMEOUT + 0.5
    assert result_bytes(res) <= MAX_RESULT_BYTES
    assert len(text) <= 4000
    assert digest(db) == before


_CONCURRENT = r"""
import json, resource, sys, threading, time
from dart_jax.tools.sqlite_exec import default_pool, execute, WORKER_MEMORY_MB
db, timeout, queries = sys.argv[1], float(sys.argv[2]), json.loads(sys.stdin.read())
pool = default_pool()
pool.warm(8)
execute(db, "SELECT 1", timeout_s=10.0)
base = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
times, errors = [None] * len(queries), [None] * len(queries)
def call(i):
    t = time.monotonic()
    errors[i] = execute(db, queries[i], timeout_s=timeout).error
    times[i] = time.monotonic() - t
threads = [threading.Thread(target=call, args=(i,)) for i in range(len(queries))]
for t in threads: t.start()
for t in threads: t.join()
limits = [open(f"/proc/{p}/limits").read() for p in pool.pids()]
as_limits = [int(l.split("Max address space")[1].split()[0]) for l in limits]
extra = (resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - base) / 1024
after = execute(db, "SELECT count(*) FROM singer", timeout_s=timeout)
print(json.dumps(dict(times=times, errors=errors, parent_extra_mb=extra, worker_as_limits=as_limits,
                      after=after.rows, killed=pool.killed)))
"""


def test_eight_concurrent_bombs_return_in_time_in_bounded_memory(db):
    """8 callers at once, each with a memory bomb: every call returns within timeout + 0.5 s, the
    calling process grows by less than 200 MB, each worker runs under a 200 MB address-space limit,
    and the pool serves a normal query afterwards. A fresh process so its peak RSS is this test's."""
    import json
    import subprocess
    import sys

    bombs = [MEMORY_BOMBS[i] for i in (0, 2, 3, 6, 7, 8, 9, 12)]
    root = os.path.join(os.path.dirname(__file__), "..", "..")
    out = subprocess.run([sys.executable, "-c", _CONCURRENT, db, str(TIMEOUT)], input=json.dumps(bombs),
                         capture_output=True, text=True, timeout=120, cwd=root, check=True)
    report = json.loads(out.stdout.strip().splitlines()[-1])
    assert max(report["times"]) < TIMEOUT + 0.5, report
    assert report["parent_extra_mb"] < 200, report
    assert report["worker_as_limits"] and max(report["worker_as_limits"]) <= 200 << 20, report
    assert report["after"] == [[6]] or report["after"] == [(6,)], report


def test_killed_worker_is_replaced_and_replies_are_plain_values(db):
    import pickle
    import signal

    from dart_jax.tools.sqlite_exec import SQLitePool, _PlainUnpickler

    pool = SQLitePool(max_workers=1)
    try:
        pool.warm(1)
        assert pool.execute(db, "SELECT 1", timeout_s=10.0).rows == [(1,)]
        os.kill(pool.pids()[0], signal.SIGSTOP)  # a worker that never answers (on any SQLite version)
        t = time.monotonic()
        res = pool.execute(db, "SELECT 1", timeout_s=0.5)
        assert res.error == "query timed out" and not res.transient and time.monotonic() - t < 1.0
        assert pool.killed == 1 and len(pool.pids()) == 0
        res = pool.execute(db, "SELECT Name FROM singer ORDER BY Name LIMIT 1", timeout_s=10.0)
        assert res.ok and res.rows == [("Joe Sharp",)]
        os.kill(pool.pids()[0], signal.SIGKILL)  # a worker that dies is a transient error, then replaced
        time.sleep(0.2)
        res = pool.execute(db, "SELECT 1", timeout_s=10.0)
        assert (res.ok and res.rows == [(1,)]) or (res.transient and "died" in res.error), res
        assert pool.execute(db, "SELECT 1", timeout_s=10.0).rows == [(1,)]
    finally:
        pool.close()
    import io
    with pytest.raises(pickle.UnpicklingError, match="only plain values"):
        _PlainUnpickler(io.BytesIO(pickle.dumps(([], [(os.getcwd,)], False, None, 0.0)))).load()


def test_rendering_never_hexes_a_whole_blob():
    from dart_jax.tools.sqlite_exec import QueryResult

    class Blob(bytes):  # the whole value must never be hexed (its slices are plain bytes)
        def hex(self, *args):
            raise AssertionError(f"hexed all {len(self)} bytes")

    big = QueryResult(["b", "s"], [(Blob(b"\xab" * 10_000_000), "y" * 10_000_000)])
    text = render_table(big)
    assert text.splitlines()[1] == "| " + "ab" * 31 + "a…" + " | " + "y" * 63 + "… |"
