"""The lexical retriever (SQLite FTS5 BM25): built over the shipped corpus, title queries find their
passage, free text can never act as FTS5 syntax, the tool renders its passages as the dense
retriever's, run configs select it (retriever.kind), the serving path and the command line use it."""

import collections
import json
import os
import random
import sqlite3
import subprocess
import sys
import threading

import pytest

from configs import base
from dart_jax.data.corpus import read_corpus
from dart_jax.errors import UserError
from dart_jax.rollout.protocol import QA
from dart_jax.run.checks import check_retriever
from dart_jax.run.spec import run_spec
from dart_jax.run.task import make_tool
from dart_jax.tools.lexical import (
    DB,
    MAX_TERMS,
    LexicalRetriever,
    build_lexical_index,
    ensure_lexical_index,
    index_kind,
    match_query,
    split_title,
)
from dart_jax.tools.retrieval import DEFAULT_CORPUS, META, RetrievalTool, Retriever, ensure_index, format_passages

ROOT = os.path.join(os.path.dirname(__file__), "..", "..")


@pytest.fixture(scope="module")
def docs():
    return read_corpus(DEFAULT_CORPUS)


@pytest.fixture(scope="module")
def index_dir(tmp_path_factory):
    return build_lexical_index(DEFAULT_CORPUS, str(tmp_path_factory.mktemp("lexical")))


@pytest.fixture(scope="module")
def lexical(index_dir):
    return LexicalRetriever(index_dir)


def _unique_title_sample(docs, n=200, seed=0):
    titles = [split_title(d["contents"])[0] for d in docs]
    counts = collections.Counter(titles)
    return random.Random(seed).sample([i for i, t in enumerate(titles) if counts[t] == 1], n), titles


def test_title_queries_find_their_passage(lexical, docs, index_dir):
    """200 sampled titles that name one passage of the 6,566: top-1 97.5%, top-3 100% (dense MiniLM on
    the same sample: 94.0% / 97.5%)."""
    assert len(lexical) == len(docs) == 6566 and index_kind(index_dir) == "lexical"
    pick, titles = _unique_title_sample(docs)
    hits = lexical.search([titles[i] for i in pick], 3)
    found = [[d["id"] == docs[i]["id"] for d, _ in h] for h, i in zip(hits, pick)]
    top1 = sum(f[:1] == [True] for f in found) / len(pick)
    top3 = sum(any(f) for f in found) / len(pick)
    assert top1 >= 0.95 and top3 >= 0.98, (top1, top3)
    for h in hits:  # BM25 order, scores -bm25 (higher is better)
        scores = [s for _, s in h]
        assert 1 <= len(h) <= 3 and scores == sorted(scores, reverse=True) and all(s > 0 for s in scores)


HOSTILE = [
    'title:"Paris" NEAR(capital city, 2) *',
    '"unbalanced quote',
    '" OR "" OR *',
    ") ( ) (",
    "Paris AND NOT France",
    "Paris NOT France",
    "NEAR/3 Paris ^capital",
    "{title body}: Paris",
    "- Paris + France",
    "body : Paris",
    "'; DROP TABLE docs; --",
    "fts MATCH 'x' OR rowid > 0",
    "Paris\x00France",
    "\ud800 Paris",  # a lone surrogate cannot be bound as UTF-8: it is not a word, so it is dropped
    "rank:bm25(fts, 100, 0)",
    "Pa*ris",
]


@pytest.mark.parametrize("query", HOSTILE, ids=range(len(HOSTILE)))
def test_hostile_queries_are_plain_words(lexical, query):
    """No query errors or changes meaning: its hits are those of the same words lowercased (FTS5
    operators are upper-case only) with every non-word character replaced by a space."""
    plain = "".join(ch if ch.isalnum() else " " for ch in query).lower()
    got, want = lexical.search([query, plain], 5)
    assert [(d["id"], round(s, 9)) for d, s in got] == [(d["id"], round(s, 9)) for d, s in want]
    expr = match_query(query)
    parts = expr.split(" OR ") if expr else []
    assert all(p.startswith('"') and p.endswith('"') and '"' not in p[1:-1] for p in parts)


def test_operators_are_words(lexical):
    """NOT excludes nothing, AND requires nothing: "Paris NOT France" ranks passages holding France."""
    hits = lexical.search(["Paris NOT France"], 20)[0]
    assert any("France" in d["contents"] for d, _ in hits)
    assert match_query("x NOT y AND z") == ('"x" OR "not" OR "y" OR "and" OR "z" OR "x not" OR "not y" OR "y and" '
                                             'OR "and z"')


def test_empty_queries_find_nothing(lexical):
    assert lexical.search(["", "   ", "!!! *** ((( )))", '""', "\ud800"], 3) == [[], [], [], [], []]
    assert lexical.search([], 3) == [] and lexical.search(["Paris"], 0) == [[]]
    tool = RetrievalTool(lexical, topk=3)
    assert tool.batch(["", "Paris"])[0] == "" and tool.batch(["Paris"])[0].startswith("Doc 1(Title: ")


def test_long_query_is_capped(lexical):
    words = [f"qzxw{i}" for i in range(5000)]
    assert len(match_query(" ".join(words)).split(" OR ")) == 2 * MAX_TERMS  # words and adjacent pairs
    assert lexical.search([" ".join(words) + " Paris"], 3) == [[]]  # words past the cap are not searched
    assert len(lexical.search(["Paris " * 20000], 3)[0]) == 3  # repeats collapse to one term


def test_unicode_and_ties(tmp_path):
    """Case and diacritics are folded, CJK and Cyrillic titles are found, stemming joins word forms;
    identical passages tie and keep corpus order; two builds answer identically."""
    rows = [{"id": "z", "contents": '"Zürich"\nZürich is a city on the Limmat.'},
            {"id": "t", "contents": '"東京"\n東京 は 日本 の 首都'},
            {"id": "m", "contents": '"Москва"\nМосква — столица России.'},
            {"id": "a", "contents": '"Ångström"\nThe ångström is a unit of length.'},
            {"id": "d1", "contents": '"Twin"\nThe twin passage founded here.'},
            {"id": "d2", "contents": '"Twin"\nThe twin passage founded here.'},
            {"id": "e", "contents": '"Founding"\nA passage about founders.', "extra": [1, 2]}]
    corpus = tmp_path / "c.jsonl"
    corpus.write_text("".join(json.dumps(r, ensure_ascii=False) + "\n" + ("\n" if i == 2 else "")
                              for i, r in enumerate(rows)), encoding="utf-8")
    r = LexicalRetriever(build_lexical_index(str(corpus), str(tmp_path / "a")))
    ids = lambda q, k=1: [d["id"] for d, _ in r.search([q], k)[0]]  # noqa: E731
    assert ids("ZURICH") == ["z"] and ids("zurich limmat") == ["z"]
    assert ids("東京") == ["t"] and ids("москва") == ["m"] and ids("angstrom") == ["a"]
    assert ids("twin", 3) == ["d1", "d2"]
    assert ids("founders") == ["e"] and set(ids("founded", 3)) == {"d1", "d2", "e"}  # porter: found/founder
    assert r.search(["founders"], 1)[0][0][0] == rows[-1]  # the corpus row itself, extra fields included
    again = LexicalRetriever(build_lexical_index(str(corpus), str(tmp_path / "b")))
    queries = ["twin founded", "Zürich", "unit of length", "the passage"]
    assert r.search(queries, 5) == again.search(queries, 5)


def test_a_name_beats_passages_sharing_its_words(tmp_path):
    """Invented names share parts (the lab's distractors): "Trounith Works" must rank its own passage
    above people named Trounith whose passages say "works" more often. Words alone ranked it third
    (3.64 vs 4.26 / 4.02); the adjacent-pair phrase puts it first."""
    rows = [("Fosken Trounith", "Fosken Trounith is an engineer at Keilvexon Shipyards. Trounith was born in Dalmere. "
                                "He works at night."),
            ("Stounina Trounith", "Stounina Trounith is a painter. Trounith works with Fosken Trounith."),
            ("Trounith Works", "Trounith Works is a shipyard founded in 1901 in Dalmere by three brothers, who built "
                               "barges and ferries for the river trade of the whole valley for decades.")]
    rows += [(f"Filler {i}", f"Filler {i} works in town {i}; nothing else.") for i in range(30)]
    corpus = tmp_path / "c.jsonl"
    corpus.write_text("".join(json.dumps({"id": str(i), "contents": f'"{t}"\n{b}'}) + "\n"
                              for i, (t, b) in enumerate(rows)))
    r = LexicalRetriever(build_lexical_index(str(corpus), str(tmp_path / "i")))
    assert [split_title(d["contents"])[0] for d, _ in r.search(["Trounith Works"], 3)[0]] == \
           ["Trounith Works", "Stounina Trounith", "Fosken Trounith"]
    assert [d["id"] for d, _ in r.search(["Fosken Trounith"], 1)[0]] == ["0"]


def test_rendered_like_the_dense_retriever(lexical, docs, tmp_path, monkeypatch):
    """The docs are the corpus rows, as the dense retriever reads them: the same passage renders
    identically through RetrievalTool either way."""
    monkeypatch.setenv("DART_JAX_CACHE", str(tmp_path))
    dense = Retriever(ensure_index())
    pick, titles = _unique_title_sample(docs, 20, seed=1)
    position = {d["id"]: n for n, d in enumerate(docs)}
    for (ldocs, dhits) in zip(lexical.search([titles[i] for i in pick], 3),
                              dense.search([titles[i] for i in pick], 3)):
        assert [dense.corpus[position[d["id"]]] for d, _ in ldocs] == [d for d, _ in ldocs]
        same = [d for d, _ in ldocs][:1]
        if dhits[0][0]["id"] == same[0]["id"]:
            assert format_passages(same) == format_passages([dhits[0][0]])
    query = [titles[pick[0]]]
    assert RetrievalTool(lexical).batch(query) == [format_passages([dense.corpus[position[d["id"]]]
                                                                    for d, _ in lexical.search(query, 3)[0]])]


def test_config_selects_the_lexical_retriever(tmp_path, monkeypatch, index_dir):
    monkeypatch.setenv("DART_JAX_CACHE", str(tmp_path))
    c = base.get()
    c.retriever.kind = "lexical"
    tool = make_tool(run_spec(c), QA)  # no index_dir: built on first use next to the cache, keyed by the corpus
    assert isinstance(tool.searcher, LexicalRetriever) and tool.topk == 3
    assert os.path.isfile(os.path.join(ensure_lexical_index(), DB)) and ensure_lexical_index().startswith(str(tmp_path))
    text = tool.batch(["Destination X wrestling"])[0]
    assert text.startswith('Doc 1(Title: "Destination X") ') and text.count("Doc ") >= 3
    c.retriever.index_dir = index_dir
    assert make_tool(run_spec(c), QA).searcher.count == 6566
    check = check_retriever(run_spec(c))  # preflight reads the lexical directory (it has no index.faiss)
    assert not check.failed and check.message == f"lexical index {index_dir}: 6566 passages", check.message
    c.retriever.index_dir = str(tmp_path)
    assert "has no meta.json" in check_retriever(run_spec(c)).message
    assert run_spec(base.get()).retriever.kind == "dense"
    bad = base.get()
    bad.retriever.kind = "bm25"
    with pytest.raises(UserError, match=r"retriever.kind='bm25'; expected one of dense, lexical"):
        run_spec(bad)
    bad = base.get()
    bad.retriever.kind, bad.retriever.query_prefix = "lexical", "query: "
    with pytest.raises(UserError, match="lexical index has none"):
        run_spec(bad)
    dense_dir = ensure_index()
    with pytest.raises(UserError, match="is a dense .faiss. index: set retriever.kind=dense"):
        LexicalRetriever(dense_dir)
    with pytest.raises(UserError, match="is a lexical .SQLite FTS5. index: set retriever.kind=lexical"):
        Retriever(index_dir)


def test_read_only_and_thread_safe(index_dir, docs):
    db = os.path.join(index_dir, DB)
    before = (os.path.getsize(db), os.stat(db).st_mtime_ns)
    r = LexicalRetriever(index_dir)
    with pytest.raises(sqlite3.OperationalError, match="readonly|read-only|query_only"):
        r._conn().execute("DELETE FROM docs")
    pick, titles = _unique_title_sample(docs, 64, seed=2)
    queries = [titles[i] for i in pick]
    serial = r.search(queries, 3)
    results, errors = {}, []

    def work(k):
        try:
            results[k] = r.search(queries[k::8], 3)
        except Exception as e:  # noqa: BLE001
            errors.append(e)
    threads = [threading.Thread(target=work, args=(k,)) for k in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors and all(results[k] == serial[k::8] for k in range(8))
    assert (os.path.getsize(db), os.stat(db).st_mtime_ns) == before
    assert sorted(os.listdir(index_dir)) == sorted([META, DB])  # no journal or WAL files left by searching


def test_changed_database_is_refused(tmp_path):
    corpus = tmp_path / "c.jsonl"
    corpus.write_text('{"id": "1", "contents": "\\"A\\"\\nalpha"}\n')
    out = build_lexical_index(str(corpus), str(tmp_path / "i"))
    with open(os.path.join(out, DB), "ab") as f:
        f.write(b"\0" * 4096)
    with pytest.raises(UserError, match="bytes, not the"):
        LexicalRetriever(out)
    (tmp_path / "bad.jsonl").write_text('{"id": "1", "contents": "\\"A\\"\\nalpha"}\n{"id": 2}\n')
    with pytest.raises(UserError, match=r'bad.jsonl:2: not a Search-R1 row'):
        build_lexical_index(str(tmp_path / "bad.jsonl"), str(tmp_path / "j"))


def test_served_and_built_from_the_command_line(tmp_path):
    """launch.build_index --kind=lexical writes the directory; launch.serve_retriever --index serves it
    (its meta.json says lexical) and answers as the in-process retriever does."""
    from dart_jax.tools.retrieval_server import RemoteRetriever
    corpus = tmp_path / "c.jsonl"
    corpus.write_text("".join(json.dumps({"id": str(i), "contents": f'"{t}"\n{t} is a capital.'}) + "\n"
                              for i, t in enumerate(("Paris", "Berlin", "Rome"))))
    run = subprocess.run([sys.executable, "-m", "launch.build_index", "--kind=lexical", f"--corpus={corpus}",
                          f"--out={tmp_path / 'idx'}"], cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert run.returncode == 0 and "lexical index written to" in run.stdout, run.stderr[-2000:]
    run = subprocess.run([sys.executable, "-m", "launch.build_index", "--kind=lexical", "--nlist=4",
                          f"--corpus={corpus}", f"--out={tmp_path / 'idx2'}"], cwd=ROOT, capture_output=True,
                         text=True, timeout=300)
    assert run.returncode == 2 and "--nlist: for a dense index, not for --kind=lexical" in run.stderr
    local, queries = LexicalRetriever(str(tmp_path / "idx")), ["Berlin", 'NEAR("x" *', "Rome capital"]
    server = subprocess.Popen([sys.executable, "-m", "launch.serve_retriever", f"--index={tmp_path / 'idx'}",
                               "--port=0"], cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
    try:
        lines = [server.stdout.readline(), server.stdout.readline()]
        assert lines[0].startswith("lexical (SQLite FTS5 BM25): 3 passages"), lines
        url = lines[1].split()[2]  # "serving POST http://127.0.0.1:PORT/retrieve (GET /health)"
        remote = RemoteRetriever(url).search(queries, 3)
    finally:
        server.terminate()
        server.wait(30)
    rounded = lambda hits: [[(d["contents"], round(s, 5)) for d, s in h] for h in hits]  # noqa: E731
    assert rounded(remote) == rounded(local.search(queries, 3))
    assert remote[0][0][0]["contents"].startswith('"Berlin"') and remote[1] == []
