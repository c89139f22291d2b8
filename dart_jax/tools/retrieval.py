"""Dense retrieval: faiss indexes over a Search-R1 corpus, an in-process retriever, and the
passage rendering of Search-R1 (REFERENCE §7–8)."""

from __future__ import annotations

import hashlib
import json
import os
import shutil
from typing import Protocol

import faiss
import numpy as np
from tqdm import tqdm

from dart_jax.data.corpus import read_corpus
from dart_jax.tools.encoder import Encoder

INDEX_KINDS = ("flat", "hnsw", "ivfpq")
REPO_DATA = os.path.join(os.path.dirname(__file__), "..", "..", "data")
DEFAULT_CORPUS = os.path.normpath(os.path.join(REPO_DATA, "corpus", "wiki_sample.jsonl"))
DEFAULT_ENCODER = "all-minilm-l6-v2"


class Searcher(Protocol):
    def search(self, queries: list[str], topk: int) -> list[list[tuple[dict, float]]]: ...


def make_index(dim: int, kind: str, n: int, nlist: int | None = None, pq_m: int | None = None,
               hnsw_m: int = 32) -> faiss.Index:
    """Inner-product indexes: exact Flat IP (default), HNSW, IVF-PQ (wiki-scale; needs training)."""
    if kind == "flat":
        return faiss.IndexFlatIP(dim)
    if kind == "hnsw":
        index = faiss.IndexHNSWFlat(dim, hnsw_m, faiss.METRIC_INNER_PRODUCT)
        index.hnsw.efSearch = 128
        return index
    if kind == "ivfpq":
        nlist = nlist or max(1, int(4 * np.sqrt(n)))
        pq_m = pq_m or next(m for m in (64, 48, 32, 24, 16, 12, 8, 4, 2, 1) if dim % m == 0)
        return faiss.index_factory(dim, f"IVF{nlist},PQ{pq_m}", faiss.METRIC_INNER_PRODUCT)
    raise ValueError(f"index kind {kind!r}; expected one of {INDEX_KINDS}")


def encode_corpus(docs: list[dict], enc: Encoder, batch_size: int = 128, progress: bool = True) -> np.ndarray:
    """Passage embeddings f32[N, D]; batches are formed over length-sorted passages so padding
    stays small, then scattered back to corpus order."""
    order = np.argsort([len(d["contents"]) for d in docs], kind="stable")
    embs = np.zeros((len(docs), enc.dim), np.float32)
    bar = tqdm(total=len(docs), desc="encoding passages", disable=not progress, unit="doc")
    for i in range(0, len(docs), batch_size):
        idx = order[i:i + batch_size]
        embs[idx] = enc.encode([docs[j]["contents"] for j in idx], kind="passage", batch_size=batch_size)
        bar.update(len(idx))
    bar.close()
    return embs


def build_index(corpus_path: str, encoder: str | Encoder, out_dir: str, kind: str = "flat",
                batch_size: int = 128, nlist: int | None = None, pq_m: int | None = None,
                progress: bool = True, embeddings: np.ndarray | None = None,
                save_embeddings: str | None = None) -> str:
    """Encode (or take precomputed `embeddings` for) every passage and write index.faiss,
    corpus.jsonl and meta.json to `out_dir`."""
    enc = encoder if isinstance(encoder, Encoder) else Encoder(encoder)
    docs = read_corpus(corpus_path)
    if embeddings is None:
        embs = encode_corpus(docs, enc, batch_size, progress)
    else:
        embs = np.ascontiguousarray(embeddings, np.float32)
        if embs.shape != (len(docs), enc.dim):
            raise ValueError(f"embeddings have shape {embs.shape}, expected {(len(docs), enc.dim)} for {corpus_path}")
    if save_embeddings:
        np.save(save_embeddings, embs.astype(np.float16))
    index = make_index(enc.dim, kind, len(docs), nlist, pq_m)
    if not index.is_trained:
        index.train(embs)
    index.add(embs)
    os.makedirs(out_dir, exist_ok=True)
    faiss.write_index(index, os.path.join(out_dir, "index.faiss"))
    shutil.copyfile(corpus_path, os.path.join(out_dir, "corpus.jsonl"))
    meta = {"encoder": enc.path, "kind": kind, "dim": enc.dim, "count": len(docs),
            "query_prefix": enc.query_prefix, "passage_prefix": enc.passage_prefix,
            "corpus_sha1": _sha1(corpus_path)}
    with open(os.path.join(out_dir, "meta.json"), "w") as f:
        json.dump(meta, f, indent=2)
    return out_dir


def _sha1(path: str) -> str:
    h = hashlib.sha1()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


def shipped_embeddings(corpus_path: str, encoder: str) -> np.ndarray | None:
    """Precomputed passage embeddings shipped beside the corpus (`<stem>.<encoder>.f16.npy` with
    a JSON sidecar), used only when the sidecar's corpus hash and encoder match."""
    stem = os.path.splitext(corpus_path)[0]
    meta_path, npy = f"{stem}.{encoder}.json", f"{stem}.{encoder}.f16.npy"
    if not (os.path.isfile(meta_path) and os.path.isfile(npy)):
        return None
    with open(meta_path) as f:
        meta = json.load(f)
    if meta.get("corpus_sha1") != _sha1(corpus_path) or meta.get("encoder") != encoder:
        return None
    return np.load(npy).astype(np.float32)


def default_index_dir(corpus_path: str = DEFAULT_CORPUS, encoder: str = DEFAULT_ENCODER) -> str:
    root = os.environ.get("DART_JAX_CACHE", os.path.join(os.path.expanduser("~"), ".cache", "dart_jax"))
    return os.path.join(root, "index", f"{encoder}-{_sha1(corpus_path)[:12]}")


def ensure_index(corpus_path: str = DEFAULT_CORPUS, encoder: str = DEFAULT_ENCODER, kind: str = "flat") -> str:
    """The cached index of (corpus, encoder): built on first use from the shipped embeddings when
    they match, else by encoding the corpus (~8 min for 6.6k passages on 2 CPU cores)."""
    out = default_index_dir(corpus_path, encoder) + ("" if kind == "flat" else f"-{kind}")
    if not os.path.isfile(os.path.join(out, "meta.json")):
        build_index(corpus_path, encoder, out + ".tmp", kind, embeddings=shipped_embeddings(corpus_path, encoder))
        shutil.rmtree(out, ignore_errors=True)
        os.replace(out + ".tmp", out)
    return out


class Retriever:
    """In-process dense retriever over an index directory written by `build_index`."""

    def __init__(self, index_dir: str, encoder: Encoder | None = None):
        meta_path = os.path.join(index_dir, "meta.json")
        if not os.path.isfile(meta_path):
            raise FileNotFoundError(f"{meta_path} not found: build one with python -m launch.build_index")
        with open(meta_path) as f:
            self.meta = json.load(f)
        self.index = faiss.read_index(os.path.join(index_dir, "index.faiss"))
        self.docs = read_corpus(os.path.join(index_dir, "corpus.jsonl"))
        if self.index.ntotal != len(self.docs):
            raise ValueError(f"{index_dir}: index holds {self.index.ntotal} vectors for {len(self.docs)} passages")
        self.encoder = encoder or Encoder(self.meta["encoder"], query_prefix=self.meta["query_prefix"],
                                          passage_prefix=self.meta["passage_prefix"])
        if hasattr(self.index, "nprobe"):
            self.index.nprobe = 16

    def search(self, queries: list[str], topk: int = 3) -> list[list[tuple[dict, float]]]:
        if not queries:
            return []
        q = self.encoder.encode(list(queries), kind="query")
        scores, ids = self.index.search(q, topk)
        return [[(self.docs[i], float(s)) for i, s in zip(row_ids, row_scores) if i >= 0]
                for row_ids, row_scores in zip(ids, scores)]


def format_passages(docs: list[dict]) -> str:
    """Search-R1's rendering: 'Doc {k}(Title: {first line}) {rest}\\n' per passage."""
    out = []
    for k, d in enumerate(docs, 1):
        lines = d["contents"].split("\n")
        out.append(f"Doc {k}(Title: {lines[0]}) {chr(10).join(lines[1:])}\n")
    return "".join(out)


class RetrievalTool:
    """The <search> tool: queries -> rendered top-k passages (the text inside <information>)."""

    def __init__(self, searcher: Searcher, topk: int = 3):
        self.searcher, self.topk = searcher, topk

    def batch(self, queries: list[str]) -> list[str]:
        return [format_passages([d for d, _ in hits]) for hits in self.searcher.search(queries, self.topk)]
