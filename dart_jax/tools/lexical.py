"""Lexical retrieval: an SQLite FTS5 BM25 index over a Search-R1 corpus, behind the dense retriever's
contract (`retrieval.Searcher`), so the <search> tool, the retrieval server and the rendering are the same.

Why: a query that names an invented entity ("Tavrel Osk") is found by its exact words; a small dense
encoder maps unseen names to nearby vectors of other names. BM25 ranks by the words themselves.

An index directory holds meta.json ("retriever": "lexical", the corpus's path, sha1 and passage count,
the database file's size and mtime) and lexical.sqlite: table `docs` (row number -> the corpus row as
its JSON line) and the contentless FTS5 table `fts` (title, body), tokenised by unicode61 (case and
diacritics folded) with Porter stemming. Title = the first line of "contents" without its quotes, body
= the rest; BM25 weighs title words `TITLE_WEIGHT` times body words.

Queries are free text, never FTS5 syntax: each is cut into words (Unicode letters and digits), every
word and every pair of adjacent words is quoted as an FTS5 string and the strings are OR-ed, so quotes,
NEAR, AND/OR/NOT, `*`, `^`, `column:` filters and parentheses are plain text. A query without a word
finds nothing ([]).
Scores are -bm25 (higher is better), hits in BM25 order, ties by corpus order.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import re
import shutil
import sqlite3
import threading
import time

from dart_jax.data.paths import cache_root
from dart_jax.errors import UserError
from dart_jax.tools.retrieval import DEFAULT_CORPUS, META
from dart_jax.tools.sqlite_exec import readonly_uri

DB = "lexical.sqlite"
LEXICAL_LAYOUT = 1
TOKENIZER = "porter unicode61 remove_diacritics 2"
TITLE_WEIGHT, BODY_WEIGHT = 8.0, 1.0
MAX_TERMS = 64  # distinct words (and word pairs) of a query searched at most: each costs a posting list
_WORD = re.compile(r"[^\W_]+")  # Unicode letters and digits; everything else separates words
_BATCH = 5000  # rows per insert batch while building

log = logging.getLogger(__name__)


def split_title(contents: str) -> tuple[str, str]:
    """(title, body) of a Search-R1 passage '"Title"\\ntext' (the title's surrounding quotes dropped)."""
    first, _, rest = contents.partition("\n")
    first = first.strip()
    if len(first) >= 2 and first[0] == first[-1] == '"':
        first = first[1:-1]
    return first, rest


def match_query(query: str) -> str:
    """The FTS5 MATCH expression for free text: its distinct words (case-folded, the first `MAX_TERMS`)
    and distinct pairs of adjacent words (as many again), each a quoted string or two-word phrase,
    OR-ed; "" when the text has no word. A word holds no quote, so no part of the text can close a
    string and become an operator. The pairs reward a passage holding a name's words together
    ("Trounith Works" over "Fosken Trounith"): lab entity names top-1 99% -> 100%."""
    words = [w.casefold() for w in _WORD.findall(query)]
    terms: dict[str, None] = {}
    for w in words:
        if len(terms) == MAX_TERMS:
            break
        terms.setdefault(w, None)
    pairs: dict[str, None] = {}
    for a, b in zip(words, words[1:]):
        if len(pairs) == MAX_TERMS:
            break
        pairs.setdefault(f"{a} {b}", None)
    return " OR ".join(f'"{t}"' for t in (*terms, *pairs))


def _rows(corpus_path: str):
    """(row number, JSON line, contents) of each non-blank corpus line (numbered as the dense index's
    offset table numbers them); a line that is not a Search-R1 row fails in one line."""
    n = 0
    with open(corpus_path, encoding="utf-8") as f:
        for lineno, line in enumerate(f, 1):
            line = line.strip()
            if not line:
                continue
            try:
                row = json.loads(line)
            except json.JSONDecodeError as e:
                raise UserError(f"{corpus_path}:{lineno}: not JSON ({e}); give a Search-R1 corpus "
                                '(rows {"id", "contents"})') from None
            if not isinstance(row, dict) or not isinstance(row.get("contents"), str) or "id" not in row:
                raise UserError(f'{corpus_path}:{lineno}: not a Search-R1 row (needs "id" and a "contents" string)')
            yield n, line, row["contents"]
            n += 1


def build_lexical_index(corpus_path: str, out_dir: str) -> str:
    """Write lexical.sqlite (built under a temporary name, then renamed) and meta.json to `out_dir`."""
    if not os.path.isfile(corpus_path):
        raise FileNotFoundError(f"corpus {corpus_path} does not exist")
    os.makedirs(out_dir, exist_ok=True)
    db, tmp = os.path.join(out_dir, DB), os.path.join(out_dir, DB + ".tmp")
    if os.path.exists(tmp):
        os.remove(tmp)
    t0 = time.perf_counter()
    conn = sqlite3.connect(tmp, isolation_level=None)
    try:
        conn.execute("PRAGMA journal_mode = OFF")
        conn.execute("PRAGMA synchronous = OFF")
        conn.execute("CREATE TABLE docs(n INTEGER PRIMARY KEY, row TEXT NOT NULL)")
        conn.execute(f"CREATE VIRTUAL TABLE fts USING fts5(title, body, content='', tokenize='{TOKENIZER}')")
        conn.execute("BEGIN")
        count, batch = 0, []
        for n, line, contents in _rows(corpus_path):
            batch.append((n, line, *split_title(contents)))
            if len(batch) == _BATCH:
                _insert(conn, batch)
                count += len(batch)
                batch = []
        _insert(conn, batch)
        count += len(batch)
        conn.execute("COMMIT")
        conn.execute("INSERT INTO fts(fts) VALUES ('optimize')")  # one b-tree per term: fewer pages per search
        conn.execute("VACUUM")  # drop the pages the merge freed (6.6k passages: 9.6 -> 7.0 MB)
    finally:
        conn.close()
    os.replace(tmp, db)
    st = os.stat(db)
    meta = {"layout": LEXICAL_LAYOUT, "retriever": "lexical", "count": count, "tokenizer": TOKENIZER,
            "corpus": os.path.realpath(corpus_path), "corpus_sha1": _sha1(corpus_path),
            "sources": {DB: {"path": os.path.realpath(db), "size": st.st_size, "mtime": st.st_mtime}}}
    with open(os.path.join(out_dir, META), "w") as f:
        json.dump(meta, f, indent=2)
    log.info("lexical index of %s: %d passages, %.1f MB, %.1f s", corpus_path, count, st.st_size / 1e6,
             time.perf_counter() - t0)
    return out_dir


def _insert(conn: sqlite3.Connection, batch: list[tuple]) -> None:
    conn.executemany("INSERT INTO docs(n, row) VALUES (?, ?)", [(n, line) for n, line, _, _ in batch])
    conn.executemany("INSERT INTO fts(rowid, title, body) VALUES (?, ?, ?)", [(n, t, b) for n, _, t, b in batch])


def _sha1(path: str) -> str:
    with open(path, "rb") as f:
        return hashlib.file_digest(f, "sha1").hexdigest()


def index_kind(index_dir: str) -> str:
    """"lexical" or "dense": what launch.build_index wrote into `index_dir` (its meta.json says)."""
    meta_path = os.path.join(index_dir, META)
    if not os.path.isfile(meta_path):
        raise FileNotFoundError(f"{meta_path} not found: build one with python -m launch.build_index")
    with open(meta_path) as f:
        return "lexical" if json.load(f).get("retriever") == "lexical" else "dense"


def default_lexical_dir(corpus_path: str = DEFAULT_CORPUS) -> str:
    return os.path.join(cache_root(), "index", f"lexical-{_sha1(corpus_path)[:12]}")


def ensure_lexical_index(corpus_path: str = DEFAULT_CORPUS) -> str:
    """The cached lexical index of `corpus_path` (keyed by its sha1), built on first use (~1 s for 6.6k passages)."""
    out = default_lexical_dir(corpus_path)
    meta = os.path.join(out, META)
    fresh = False
    if os.path.isfile(meta):
        with open(meta) as f:
            fresh = json.load(f).get("layout") == LEXICAL_LAYOUT
    if not fresh:
        shutil.rmtree(out + ".tmp", ignore_errors=True)
        build_lexical_index(corpus_path, out + ".tmp")
        # the database records its own path: rewrite it for the final directory
        shutil.rmtree(out, ignore_errors=True)
        os.replace(out + ".tmp", out)
        _repoint(out)
    return out


def _repoint(out_dir: str) -> None:
    path = os.path.join(out_dir, META)
    with open(path) as f:
        meta = json.load(f)
    meta["sources"][DB]["path"] = os.path.realpath(os.path.join(out_dir, DB))
    with open(path, "w") as f:
        json.dump(meta, f, indent=2)


class LexicalRetriever:
    """BM25 over an index directory written by `build_lexical_index`, read-only (a `mode=ro` URI and
    `PRAGMA query_only`: the search path cannot write the file). One connection per thread, so the
    retrieval server's search thread and a training loop's threads may share one retriever."""

    def __init__(self, index_dir: str, title_weight: float = TITLE_WEIGHT, body_weight: float = BODY_WEIGHT):
        if index_kind(index_dir) != "lexical":
            raise UserError(f"{index_dir} is a dense (faiss) index: set retriever.kind=dense, or build a lexical one "
                            "with python -m launch.build_index --kind=lexical")
        with open(os.path.join(index_dir, META)) as f:
            self.meta = json.load(f)
        if self.meta.get("layout") != LEXICAL_LAYOUT:
            raise UserError(f"{index_dir} was written in lexical layout {self.meta.get('layout')}, not "
                            f"{LEXICAL_LAYOUT}: run python -m launch.build_index --kind=lexical for it again")
        self.path = os.path.join(index_dir, DB)
        seen = self.meta["sources"][DB]
        if not os.path.isfile(self.path):
            raise FileNotFoundError(f"{self.path} is missing: run python -m launch.build_index --kind=lexical again")
        if os.stat(self.path).st_size != seen["size"]:
            raise UserError(f"{self.path} is {os.stat(self.path).st_size} bytes, not the {seen['size']} it was when "
                            f"{index_dir} was written: run python -m launch.build_index --kind=lexical again")
        self.weights = (float(title_weight), float(body_weight))
        self._local = threading.local()
        self.count = int(self._conn().execute("SELECT count(*) FROM docs").fetchone()[0])
        if self.count != self.meta["count"]:
            raise UserError(f"{self.path} holds {self.count} passages, meta.json says {self.meta['count']}")
        log.info("lexical retriever %s: %d passages, BM25 weights title %g, body %g", index_dir, self.count,
                 *self.weights)

    def __len__(self) -> int:
        return self.count

    def _conn(self) -> sqlite3.Connection:
        conn = getattr(self._local, "conn", None)
        if conn is None:
            conn = sqlite3.connect(readonly_uri(self.path), uri=True, isolation_level=None)
            conn.execute("PRAGMA query_only = ON")
            self._local.conn = conn
        return conn

    def search(self, queries: list[str], topk: int = 3) -> list[list[tuple[dict, float]]]:
        conn = self._conn()
        out = []
        for q in queries:
            expr = match_query(q)
            if not expr or topk < 1:
                out.append([])
                continue
            rows = conn.execute(
                "SELECT d.row, h.s FROM (SELECT rowid AS n, bm25(fts, ?, ?) AS s FROM fts WHERE fts MATCH ? "
                "ORDER BY s, rowid LIMIT ?) AS h JOIN docs AS d ON d.n = h.n ORDER BY h.s, h.n",
                (*self.weights, expr, int(topk))).fetchall()
            out.append([(json.loads(row), -float(s)) for row, s in rows])
        return out

    def close(self) -> None:
        """Close this thread's connection (others close when their thread ends)."""
        conn = getattr(self._local, "conn", None)
        if conn is not None:
            conn.close()
            self._local.conn = None
