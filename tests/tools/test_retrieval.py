"""Retrieval: shipped embeddings are the encoder's, faiss index kinds, the in-process retriever on
real NQ questions (the HTTP service: test_retrieval_server.py)."""

import json
import os

import numpy as np
import pytest

from dart_jax.data.corpus import read_corpus, read_jsonl
from dart_jax.tools.encoder import Encoder
from dart_jax.tools.retrieval import (
    DEFAULT_CORPUS,
    Retriever,
    build_index,
    ensure_index,
    format_passages,
    shipped_embeddings,
)

QA = os.path.join(os.path.dirname(DEFAULT_CORPUS), "..", "qa", "nq_oracle.jsonl")


@pytest.fixture(scope="module")
def encoder():
    return Encoder("all-minilm-l6-v2")


@pytest.fixture(scope="module")
def retriever(encoder, tmp_path_factory):
    os.environ["DART_JAX_CACHE"] = str(tmp_path_factory.mktemp("cache"))
    return Retriever(ensure_index(), encoder)


def test_shipped_embeddings_are_the_encoders(encoder):
    docs = read_corpus(DEFAULT_CORPUS)
    shipped = shipped_embeddings(DEFAULT_CORPUS, "all-minilm-l6-v2")
    assert shipped.shape == (len(docs), 384) and len(docs) == 6566
    pick = np.random.default_rng(0).choice(len(docs), 12, replace=False)
    fresh = encoder.encode([docs[i]["contents"] for i in pick], kind="passage")
    np.testing.assert_allclose(fresh, shipped[pick], atol=2e-3)


def test_nq_questions_find_their_gold_passage(retriever):
    rows = list(read_jsonl(QA))[:100]
    hits = retriever.search([r["question"] for r in rows], topk=3)
    recall = np.mean([any(r["golden_answers"][0].lower() in d["contents"].lower() for d, _ in h)
                      for r, h in zip(rows, hits)])
    assert recall >= 0.6, recall
    scores = [s for _, s in hits[0]]
    assert scores == sorted(scores, reverse=True) and all(-1.0 <= s <= 1.0 + 1e-5 for s in scores)


@pytest.mark.slow  # CI budget: kept out of the default run (python -m pytest -m slow)
def test_index_kinds(encoder, tmp_path):
    corpus = tmp_path / "c.jsonl"
    docs = read_corpus(DEFAULT_CORPUS)[:600]
    corpus.write_text("".join(json.dumps(d) + "\n" for d in docs))
    embs = shipped_embeddings(DEFAULT_CORPUS, "all-minilm-l6-v2")[:600]
    flat = Retriever(build_index(str(corpus), encoder, str(tmp_path / "flat"), embeddings=embs), encoder)
    queries = [d["contents"].split("\n")[1][:80] for d in docs[:20]]
    exact = [[d["id"] for d, _ in h] for h in flat.search(queries, 3)]
    assert np.mean([e[0] == d["id"] for e, d in zip(exact, docs[:20])]) >= 0.8
    for kind in ("hnsw", "ivfpq"):
        r = Retriever(build_index(str(corpus), encoder, str(tmp_path / kind), kind=kind, embeddings=embs,
                                  nlist=8, pq_m=48), encoder)
        approx = [[d["id"] for d, _ in h] for h in r.search(queries, 3)]
        assert np.mean([a[0] == e[0] for a, e in zip(approx, exact)]) >= 0.7, kind
    with pytest.raises(ValueError, match="embeddings have shape"):
        build_index(str(corpus), encoder, str(tmp_path / "bad"), embeddings=embs[:10])


def test_passage_rendering():
    text = format_passages([{"id": "1", "contents": "\"Paris\"\nParis is the capital."},
                            {"id": "2", "contents": "\"Lyon\"\nLyon is a city.\nSecond line."}])
    assert text == ("Doc 1(Title: \"Paris\") Paris is the capital.\n"
                    "Doc 2(Title: \"Lyon\") Lyon is a city.\nSecond line.\n")
