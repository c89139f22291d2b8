"""Hostile SQL against a real Spider database: the file never changes, every call returns an
error observation within timeout + 0.5 s."""

import hashlib
import os
import shutil
import time

import pytest

from dart_jax.tools.sqlite_exec import SQLiteTool, execute, render_table

DB = os.path.join(os.path.dirname(__file__), "..", "..", "data", "spider", "database", "concert_singer", "concert_singer.sqlite")
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
    assert res.error == "query timed out" or (res.truncated and len(res.rows) == 10)


def test_tool_batch_and_missing_database(db, tmp_path):
    out = SQLiteTool(timeout_s=TIMEOUT).batch(["SELECT count(*) FROM singer", "DROP TABLE singer"],
                                              [db, db])
    assert out[0] == "| count(*) |\n| 6 |" and out[1].startswith("Error: ")
    assert execute(str(tmp_path / "nope.sqlite"), "SELECT 1").error.startswith("cannot open database")
