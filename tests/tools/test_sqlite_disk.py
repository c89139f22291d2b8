"""Disk cap of the SQL workers: sorts (ORDER BY / GROUP BY / DISTINCT) and temp tables (recursive CTE
queues, UNION) of a hostile statement never reach the disk: the statement fails with an error
observation within its deadline, the worker holds 0 bytes of temp files and stays inside its memory
cap. A legitimate 200k-row ORDER BY on a real Spider database still returns the right rows."""

import os
import shutil
import sqlite3
import threading
import time

import pytest

from dart_jax.tools.sqlite_exec import WORKER_MEMORY_MB, SQLitePool

SPIDER = os.path.join(os.path.dirname(__file__), "..", "..", "data", "spider", "database")
TIMEOUT = 1.0
# with file temp storage these spilled ~300 MB (blob rows) / ~10 MB (UNION queue) of temp files in 1 s
HOSTILE = [
    "WITH RECURSIVE c(x) AS (SELECT 1 UNION ALL SELECT x + 1 FROM c) SELECT DISTINCT x || randomblob(1000) "
    "FROM c ORDER BY 1",
    "WITH RECURSIVE c(x) AS (SELECT 1 UNION ALL SELECT x + 1 FROM c) SELECT x || randomblob(1000), count(*) "
    "FROM c GROUP BY 1",
    "WITH RECURSIVE c(x) AS (SELECT 1 UNION SELECT x + 1 FROM c) SELECT max(x) FROM c",
]


def copy_db(tmp_path, name):
    path = tmp_path / f"{name}.sqlite"
    shutil.copy(os.path.join(SPIDER, name, f"{name}.sqlite"), path)
    return str(path)


class TempWatch:
    """Samples a worker every 10 ms: the bytes of regular files it holds open for writing, the database
    aside (SQLite's temp files are unlinked at once, so only /proc/<pid>/fd sees them), and its peak RSS."""

    def __init__(self, pid, db):
        self.pid, self.db = pid, os.stat(db)
        self.peak_bytes, self.peak_rss, self.seen = 0, 0, set()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _sample(self):
        total = 0
        try:
            fds = os.listdir(f"/proc/{self.pid}/fd")
        except OSError:
            return
        for fd in fds:
            try:
                st = os.stat(f"/proc/{self.pid}/fd/{fd}")
                target = os.readlink(f"/proc/{self.pid}/fd/{fd}")
                with open(f"/proc/{self.pid}/fdinfo/{fd}") as f:
                    flags = int(next(line for line in f if line.startswith("flags:")).split()[1], 8)
            except (OSError, StopIteration):
                continue
            writable = flags & (os.O_WRONLY | os.O_RDWR)
            if writable and (st.st_mode & 0o170000) == 0o100000 and (st.st_dev, st.st_ino) != (self.db.st_dev,
                                                                                               self.db.st_ino):
                total += st.st_size
                self.seen.add(target)
        self.peak_bytes = max(self.peak_bytes, total)
        try:
            with open(f"/proc/{self.pid}/status") as f:
                hwm = [line for line in f if line.startswith("VmHWM:")]
            self.peak_rss = max(self.peak_rss, int(hwm[0].split()[1]) << 10)
        except (OSError, IndexError):
            pass

    def _run(self):
        while not self._stop.is_set():
            self._sample()
            time.sleep(0.01)

    def __enter__(self):
        self._thread.start()
        return self

    def __exit__(self, *exc):
        self._stop.set()
        self._thread.join()


@pytest.fixture()
def pool(tmp_path, monkeypatch):
    if not os.path.isdir("/proc/self/fd"):
        pytest.skip("needs /proc")
    tmp = tmp_path / "sqlite_tmp"
    tmp.mkdir()
    monkeypatch.setenv("SQLITE_TMPDIR", str(tmp))  # where SQLite would put its temp files
    p = SQLitePool(max_workers=1)
    assert p.execute(copy_db(tmp_path, "concert_singer"), "SELECT 1").ok  # the worker is up
    p.tmp = tmp
    yield p
    p.close()


@pytest.mark.parametrize("sql", HOSTILE)
def test_hostile_sort_or_temp_table_uses_no_disk(tmp_path, pool, sql):
    db = copy_db(tmp_path, "concert_singer")
    with TempWatch(pool.pids()[0], db) as watch:
        t = time.monotonic()
        res = pool.execute(db, sql, timeout_s=TIMEOUT)
        elapsed = time.monotonic() - t
    assert not res.ok and elapsed < TIMEOUT + 0.5, (res, elapsed)
    assert watch.peak_bytes == 0, f"{watch.peak_bytes / 2**20:.0f} MiB of temp files {sorted(watch.seen)}"
    assert watch.peak_rss <= WORKER_MEMORY_MB << 20
    assert os.listdir(pool.tmp) == []
    # the worker that hit its memory cap is still good
    again = pool.execute(db, "SELECT count(*) FROM singer", timeout_s=TIMEOUT)
    assert again.ok and again.rows == [(6,)], again


def test_large_legitimate_order_by_is_right_and_uses_no_disk(tmp_path, pool):
    db = copy_db(tmp_path, "world_1")
    # ~200k rows of (name, name, int): file temp storage spilled ~6 MB of them to disk
    join = "FROM city a, country b WHERE b.Continent = 'Asia'"
    sql = f"SELECT a.Name, b.Name, a.Population * b.Population AS p {join} ORDER BY p DESC, 1, 2"
    with sqlite3.connect(db) as ref:
        want = ref.execute(sql).fetchmany(1000)
        assert ref.execute(f"SELECT count(*) {join}").fetchone()[0] > 200_000
    ref.close()
    with TempWatch(pool.pids()[0], db) as watch:
        res = pool.execute(db, sql, timeout_s=10.0, max_rows=1000)
    assert res.ok, res
    assert res.rows == want
    assert watch.peak_bytes == 0, f"{watch.peak_bytes / 2**20:.0f} MiB of temp files"


def test_wal_database_without_shm_is_still_readable(tmp_path, pool):
    """The worker's file-size backstop still lets SQLite create a WAL database's -shm index."""
    db = str(tmp_path / "wal.sqlite")
    with sqlite3.connect(db) as conn:
        conn.execute("PRAGMA journal_mode = WAL")
        conn.execute("CREATE TABLE t (a)")
        conn.executemany("INSERT INTO t VALUES (?)", [(i,) for i in range(5000)])
    conn.close()
    assert not os.path.exists(db + "-shm")
    res = pool.execute(db, "SELECT count(*), sum(a) FROM t", timeout_s=TIMEOUT)
    assert res.ok and res.rows == [(5000, 5000 * 4999 // 2)], res
