"""Search-R1's published retrieval index served as it is: an e5_Flat.index + wiki-18.jsonl written
exactly as Search-R1 writes them (tests/standins/search_r1_index.py, embeddings by transformers +
torch) adopted by `launch.build_index --adopt`, served by the real RetrievalServer on loopback and
queried through RemoteRetriever: top-k ids and scores equal a direct faiss search of the queries
Search-R1's way; the corpus is linked, not copied; E5's prefixes found for an encoder that only a
Hugging Face cache names; mismatched files refused in one line."""

import json
import os

import faiss
import huggingface_hub
import numpy as np
import pytest

from dart_jax.data.corpus import CorpusFile, line_offsets, read_corpus
from dart_jax.errors import UserError
from dart_jax.tools.encoder import Encoder
from dart_jax.tools.retrieval import (
    DEFAULT_CORPUS,
    META,
    Retriever,
    adopt_index,
    build_index,
    gpu_index,
    read_index_header,
)
from dart_jax.tools.retrieval_server import RemoteRetriever, RetrievalServer, ServerLimits
from launch import build_index as build_index_cmd
from standins.search_r1_index import search_r1_encode, tiny_e5, tiny_e5_in_hub_cache, write_search_r1_index

N_PASSAGES = 300
QUESTIONS = ["who wrote war and peace", "capital of france", "when did the lobbyist die",
             "which expedition employed an ethnologist", "portuguese fort built during the habsburg dynasty"]


@pytest.fixture(scope="module")
def hub(tmp_path_factory):
    """(cache dir, snapshot dir) of a tiny random E5 cached as intfloat/e5-base-v2."""
    cache = str(tmp_path_factory.mktemp("hf_cache"))
    return cache, tiny_e5_in_hub_cache(cache)


@pytest.fixture()
def hf_cache(hub, monkeypatch):
    """huggingface_hub looks in the test's cache (its default is read when it is imported)."""
    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_CACHE", hub[0])
    return hub[1]


@pytest.fixture(scope="module")
def published(hub, tmp_path_factory):
    """(e5_Flat.index, wiki-18.jsonl, passages) in Search-R1's formats over real Wikipedia passages."""
    passages = [d["contents"] for d in read_corpus(DEFAULT_CORPUS)[:N_PASSAGES]]
    index_path, corpus_path = write_search_r1_index(str(tmp_path_factory.mktemp("search_r1")), hub[1], passages)
    return index_path, corpus_path, passages


def test_adopted_index_served_over_http_equals_a_direct_faiss_search(published, hf_cache, tmp_path):
    index_path, corpus_path, passages = published
    out = tmp_path / "wiki18_e5"
    assert build_index_cmd.main([f"--adopt={index_path}", f"--corpus={corpus_path}",
                                 "--encoder=intfloat/e5-base-v2", f"--out={out}"]) == 0
    # linked, not copied; meta as written
    for name, target in (("index.faiss", index_path), ("corpus.jsonl", corpus_path)):
        assert os.path.islink(out / name) and os.path.realpath(out / name) == os.path.realpath(target)
    meta = json.loads((out / META).read_text())
    assert (meta["encoder"], meta["kind"], meta["dim"], meta["count"]) == ("intfloat/e5-base-v2", "flat", 32,
                                                                          N_PASSAGES)
    assert (meta["query_prefix"], meta["passage_prefix"]) == ("query: ", "passage: ")
    assert meta["sources"]["corpus.jsonl"]["size"] == os.path.getsize(corpus_path)
    offsets = np.load(out / meta["offsets"])
    with open(corpus_path, "rb") as f:
        starts = np.cumsum([0] + [len(line) for line in f])[:-1]
    np.testing.assert_array_equal(offsets, starts)

    topk = 5
    reference = search_r1_encode(hf_cache, QUESTIONS, "query: ")
    want_scores, want_ids = faiss.read_index(index_path).search(reference, topk)
    server = RetrievalServer(Retriever(str(out)), "127.0.0.1", 0, ServerLimits(warm_batch=1)).start()
    try:
        hits = RemoteRetriever(server.url, deadline_s=30).search(QUESTIONS, topk)
    finally:
        server.stop()
    assert [[int(d["id"]) for d, _ in row] for row in hits] == want_ids.tolist()
    np.testing.assert_allclose([[s for _, s in row] for row in hits], want_scores, atol=1e-5)
    assert [[d["contents"] for d, _ in row] for row in hits] == [[passages[i] for i in row] for row in want_ids]


def test_prefixes_of_an_e5_known_only_by_its_cache_entry(hf_cache, tmp_path):
    """The snapshot directory's name is a commit hash and its config.json names no model (as
    intfloat/e5-base-v2's): the repository the cache files it under decides."""
    assert os.path.basename(hf_cache) == "0" * 40
    assert json.loads(open(os.path.join(hf_cache, "config.json")).read())["_name_or_path"] == "tmp/"
    for name in (hf_cache, "intfloat/e5-base-v2"):
        enc = Encoder(name)
        assert (enc.query_prefix, enc.passage_prefix) == ("query: ", "passage: ")
        assert enc.prefix_source == "hub id 'intfloat/e5-base-v2' names E5"
    other = tiny_e5_in_hub_cache(str(tmp_path), "sentence-transformers/all-MiniLM-L6-v2")
    assert (Encoder(other).query_prefix, Encoder(other).passage_prefix) == ("", "")
    enc = Encoder(hf_cache, query_prefix="", passage_prefix="")  # given, even empty, wins
    assert (enc.query_prefix, enc.passage_prefix, enc.prefix_source) == ("", "", "given (query, passage)")


def test_mismatched_count_or_width_is_refused_in_one_line(published, hf_cache, tmp_path, capsys):
    index_path, corpus_path, _ = published
    longer = tmp_path / "wiki-18-plus-one.jsonl"
    longer.write_text(open(corpus_path).read() + json.dumps({"id": "x", "contents": "\"X\"\nx"}) + "\n")
    with pytest.raises(SystemExit) as e:  # as `python -m launch.build_index` reports it
        build_index_cmd.CLI.run(build_index_cmd.main, [f"--adopt={index_path}", f"--corpus={longer}",
                                                       "--encoder=intfloat/e5-base-v2", f"--out={tmp_path / 'a'}"])
    err = [line for line in capsys.readouterr().err.splitlines() if line.startswith("launch.")]
    assert e.value.code == 2 and len(err) == 1, err
    assert f"holds {N_PASSAGES} vectors but {longer} has {N_PASSAGES + 1} passages" in err[0]
    with pytest.raises(UserError) as e:
        adopt_index(index_path, corpus_path, "all-minilm-l6-v2", str(tmp_path / "b"))
    assert "holds 32-dimensional vectors but encoder all-minilm-l6-v2 makes 384" in str(e.value)
    assert "\n" not in str(e.value) and not os.path.exists(tmp_path / "b")


def test_a_corpus_changed_after_adoption_is_refused(published, hf_cache, tmp_path):
    index_path, corpus_path, _ = published
    copy = tmp_path / "wiki-18.jsonl"
    copy.write_bytes(open(corpus_path, "rb").read())
    out = adopt_index(index_path, str(copy), "intfloat/e5-base-v2", str(tmp_path / "idx"))
    with open(copy, "a") as f:
        f.write(json.dumps({"id": "x", "contents": "\"X\"\nx"}) + "\n")
    with pytest.raises(UserError, match=f"{copy} is .* bytes, not the .* it was"):
        Retriever(out)


def test_index_header_as_faiss_reads_it(tmp_path):
    x = np.random.default_rng(0).standard_normal((300, 16)).astype(np.float32)
    indexes = {"flat": faiss.index_factory(16, "Flat", faiss.METRIC_INNER_PRODUCT),
               "hnsw": faiss.IndexHNSWFlat(16, 8, faiss.METRIC_INNER_PRODUCT),
               "ivfpq": faiss.index_factory(16, "IVF4,PQ4", faiss.METRIC_INNER_PRODUCT),
               "flat-l2": faiss.IndexFlatL2(16)}
    for kind, index in indexes.items():
        index.train(x)
        index.add(x)
        faiss.write_index(index, str(tmp_path / kind))
        back = faiss.read_index(str(tmp_path / kind))
        assert read_index_header(str(tmp_path / kind)) == (kind, back.d, back.ntotal, back.metric_type)
    (tmp_path / "junk").write_bytes(b"\x00" * 64)
    with pytest.raises(UserError, match="does not start like a faiss index"):
        read_index_header(str(tmp_path / "junk"))


def test_corpus_rows_by_byte_offset(tmp_path):
    rows = read_corpus(DEFAULT_CORPUS)
    offsets = line_offsets(DEFAULT_CORPUS)
    np.save(tmp_path / "o.npy", offsets)
    corpus = CorpusFile(DEFAULT_CORPUS, str(tmp_path / "o.npy"))
    assert len(corpus) == len(rows) == 6566
    for i in (0, 1, 1234, len(rows) - 1):
        assert corpus[i] == rows[i]
    # blank lines hold no passage; a last line may lack its newline; CRLF files read the same
    text = '{"id": "a", "contents": "x"}\n\n{"id": "b", "contents": "y"}\r\n \n{"id": "c", "contents": "é"}'
    (tmp_path / "c.jsonl").write_bytes(text.encode())
    offsets = line_offsets(str(tmp_path / "c.jsonl"))
    np.save(tmp_path / "c.npy", offsets)
    corpus = CorpusFile(str(tmp_path / "c.jsonl"), str(tmp_path / "c.npy"))
    assert [corpus[i]["id"] for i in range(len(corpus))] == ["a", "b", "c"] and corpus[2]["contents"] == "é"
    with pytest.raises(UserError, match="gunzip"):
        line_offsets(str(tmp_path / "c.jsonl.gz"))


def test_built_index_has_the_adopted_layout_and_gpu_mode_is_checked(hf_cache, tmp_path):
    """build_index (encoding our own corpus) writes what adopt_index writes, read by the same reader;
    faiss without GPUs keeps the index on the CPU under --faiss-gpu=auto and refuses =on."""
    rows = read_corpus(DEFAULT_CORPUS)[:40]
    corpus = tmp_path / "c.jsonl"
    corpus.write_text("".join(json.dumps(d) + "\n" for d in rows))
    local = tiny_e5(str(tmp_path / "encoder"))
    out = build_index(str(corpus), local, str(tmp_path / "idx"), query_prefix="query: ", passage_prefix="passage: ",
                      progress=False)
    meta = json.loads(open(os.path.join(out, META)).read())
    assert (meta["count"], meta["dim"], meta["query_prefix"], meta["prefix_source"]) == \
        (40, 32, "query: ", "given (query, passage)")
    retriever = Retriever(out)
    want = faiss.read_index(os.path.join(out, "index.faiss")).search(search_r1_encode(local, QUESTIONS, "query: "), 3)
    assert [[d["id"] for d, _ in row] for row in retriever.search(QUESTIONS, 3)] == \
        [[rows[i]["id"] for i in row] for row in want[1]]
    assert gpu_index(retriever.index, "auto") is retriever.index
    with pytest.raises(UserError, match="--faiss-gpu=on but this faiss sees no GPU"):
        gpu_index(retriever.index, "on")
