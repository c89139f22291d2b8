"""Dense retrieval: faiss indexes over a Search-R1 corpus, an in-process retriever, and the
passage rendering of Search-R1.

An index directory holds meta.json (encoder, prefixes, dim, count, kind), index.faiss, corpus.jsonl
and corpus.offsets.npy (the byte offset of each passage's line). `build_index` encodes a corpus and
writes it; `adopt_index` makes one from Search-R1's published e5_Flat.index + wiki-18.jsonl without
re-encoding (links to them, not copies). `Retriever` reads both the same way.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import shutil
import struct
from typing import Protocol

import faiss
import numpy as np
from tqdm import tqdm

from dart_jax.data.corpus import CorpusFile, line_offsets, read_corpus
from dart_jax.data.paths import cache_root
from dart_jax.errors import UserError
from dart_jax.tools.encoder import Encoder, choose_prefixes, encoder_dim, resolve_encoder

INDEX_KINDS = ("flat", "hnsw", "ivfpq")
REPO_DATA = os.path.join(os.path.dirname(__file__), "..", "..", "data")
DEFAULT_CORPUS = os.path.normpath(os.path.join(REPO_DATA, "corpus", "wiki_sample.jsonl"))
DEFAULT_ENCODER = "all-minilm-l6-v2"
LAYOUT = 2  # meta.json "layout": 2 adds the offset table and the sources' sizes (older directories are rebuilt)
META, INDEX, CORPUS, OFFSETS = "meta.json", "index.faiss", "corpus.jsonl", "corpus.offsets.npy"
FAISS_GPU = ("auto", "on", "off")
# faiss's four-character codes of the index types written by Search-R1's index builder and by build_index
_FOURCC_KINDS = {b"IxFI": "flat", b"IxF2": "flat-l2", b"IHNf": "hnsw", b"IwPQ": "ivfpq", b"IwFl": "ivfflat"}

log = logging.getLogger(__name__)


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
                save_embeddings: str | None = None, query_prefix: str | None = None,
                passage_prefix: str | None = None) -> str:
    """Encode (or take precomputed `embeddings` for) every passage and write index.faiss,
    corpus.jsonl (a copy: the directory stands alone), its offset table and meta.json to `out_dir`.
    Prefixes: None takes the encoder's detected ones."""
    enc = encoder if isinstance(encoder, Encoder) else Encoder(encoder, query_prefix=query_prefix,
                                                              passage_prefix=passage_prefix)
    _log_prefixes(enc)
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
    faiss.write_index(index, os.path.join(out_dir, INDEX))
    shutil.copyfile(corpus_path, os.path.join(out_dir, CORPUS))
    offsets = line_offsets(os.path.join(out_dir, CORPUS))
    if len(offsets) != len(docs):
        raise ValueError(f"{corpus_path}: {len(docs)} passages read but {len(offsets)} lines found")
    np.save(os.path.join(out_dir, OFFSETS), offsets)
    _write_meta(out_dir, {"encoder": _portable(enc.name), "kind": kind,
                          "dim": enc.dim, "count": len(docs), "query_prefix": enc.query_prefix,
                          "passage_prefix": enc.passage_prefix, "prefix_source": enc.prefix_source,
                          "corpus_sha1": _sha1(corpus_path)})
    return out_dir


def read_index_header(path: str) -> tuple[str, int, int, int]:
    """(kind, dim, ntotal, metric) from the first bytes of a faiss index file, as faiss's
    write_index lays them out (four-character type code, int32 d, int64 ntotal, two int64 placeholders,
    a bool is_trained, int32 metric), so a 65 GB index is checked without being read."""
    with open(path, "rb") as f:
        head = f.read(37)
    if len(head) < 37:
        raise UserError(f"{path} is {len(head)} bytes long: not a faiss index")
    fourcc = head[:4]
    dim, ntotal = struct.unpack("<iq", head[4:16])
    (metric,) = struct.unpack("<i", head[33:37])
    if not fourcc.isalnum() or dim <= 0 or ntotal < 0:
        raise UserError(f"{path} does not start like a faiss index (type {fourcc!r}, d={dim}, ntotal={ntotal}); "
                        "give the file faiss.write_index wrote (Search-R1: e5_Flat.index)")
    return _FOURCC_KINDS.get(fourcc, fourcc.decode("ascii")), dim, ntotal, metric


def adopt_index(index_path: str, corpus_path: str, encoder: str, out_dir: str, query_prefix: str | None = None,
                passage_prefix: str | None = None) -> str:
    """An index directory over a published faiss index and its corpus (Search-R1's e5_Flat.index +
    wiki-18.jsonl) without re-encoding: meta.json, symlinks to both files, and the corpus's offset
    table (one streaming pass). Refuses, in one line, an index whose vector count is not the corpus's
    line count or whose width is not the encoder's. `encoder` is kept as given (a hub id stays a hub
    id, resolved on each machine); prefixes: None takes the encoder's detected ones."""
    for what, path in (("--adopt index", index_path), ("--corpus", corpus_path)):
        if not os.path.isfile(path):
            raise FileNotFoundError(f"{what} file {path} does not exist")
    kind, dim, ntotal, metric = read_index_header(index_path)
    enc_dim = encoder_dim(encoder)
    if dim != enc_dim:
        raise UserError(f"{index_path} holds {dim}-dimensional vectors but encoder {encoder} makes {enc_dim}: "
                        "give the encoder the index was built with (Search-R1's e5_Flat.index: intfloat/e5-base-v2)")
    if metric != faiss.METRIC_INNER_PRODUCT:
        log.warning("%s ranks by metric %d, not inner product: scores are distances, not cosine similarities",
                    index_path, metric)
    log.info("scanning %s for line offsets", corpus_path)
    offsets = line_offsets(corpus_path)
    if len(offsets) != ntotal:
        raise UserError(f"{index_path} holds {ntotal} vectors but {corpus_path} has {len(offsets)} passages: "
                        "give the corpus the index was built from (Search-R1: wiki-18.jsonl)")
    _check_rows(corpus_path, offsets)
    qp, pp, source = choose_prefixes(resolve_encoder(encoder), encoder, query_prefix, passage_prefix)
    os.makedirs(out_dir, exist_ok=True)
    for name, target in ((INDEX, index_path), (CORPUS, corpus_path)):
        link = os.path.join(out_dir, name)
        if os.path.lexists(link):
            if not os.path.islink(link):
                raise UserError(f"{link} exists and is not a link: adopt into an empty directory")
            os.remove(link)
        os.symlink(os.path.abspath(target), link)
    np.save(os.path.join(out_dir, OFFSETS), offsets)
    _write_meta(out_dir, {"encoder": _portable(encoder), "kind": kind, "dim": dim, "count": ntotal, "metric": metric,
                          "query_prefix": qp, "passage_prefix": pp, "prefix_source": source, "adopted": True})
    log.info("adopted %s (%s, %d x %d) and %s into %s; query prefix %r, passage prefix %r (%s)", index_path, kind,
             ntotal, dim, corpus_path, out_dir, qp, pp, source)
    return out_dir


def _check_rows(corpus_path: str, offsets: np.ndarray, samples: int = 16) -> None:
    """The first, last and a spread of rows parse as Search-R1 rows (a wrong file fails here, in one
    line, not at the first search)."""
    if not len(offsets):
        return
    rows = np.unique(np.linspace(0, len(offsets) - 1, min(samples, len(offsets))).astype(np.int64))
    with open(corpus_path, "rb") as f:
        for i in rows:
            f.seek(int(offsets[i]))
            line = f.readline()
            try:
                row = json.loads(line)
            except (json.JSONDecodeError, UnicodeDecodeError):
                raise UserError(f"{corpus_path}: line {i + 1} is not JSON: give the JSONL corpus "
                                '(Search-R1: wiki-18.jsonl, rows {"id", "contents"})') from None
            if not isinstance(row, dict) or "contents" not in row:
                raise UserError(f'{corpus_path}: row {i + 1} lacks "contents" (Search-R1 rows are '
                                '{"id", "contents"})')


def _write_meta(out_dir: str, meta: dict) -> None:
    """meta.json with the layout version and the size and mtime of the index and corpus files as
    written or adopted (the reader refuses a corpus whose size changed: its offsets would be wrong)."""
    sources = {}
    for name in (INDEX, CORPUS):
        path = os.path.join(out_dir, name)
        st = os.stat(path)
        sources[name] = {"path": os.path.realpath(path), "size": st.st_size, "mtime": st.st_mtime}
    with open(os.path.join(out_dir, META), "w") as f:
        json.dump({"layout": LAYOUT, **meta, "offsets": OFFSETS, "sources": sources}, f, indent=2)


def _portable(encoder: str) -> str:
    """How meta.json names the encoder: a directory by its absolute path (the index is read from any
    working directory), an embedded name or hub id as given (resolved on the machine that reads it)."""
    return os.path.abspath(encoder) if os.path.isdir(encoder) else encoder


def _log_prefixes(enc: Encoder) -> None:
    log.info("encoder %s: query prefix %r, passage prefix %r (%s)", enc.name, enc.query_prefix, enc.passage_prefix,
             enc.prefix_source)


def _sha1(path: str) -> str:
    with open(path, "rb") as f:
        return hashlib.file_digest(f, "sha1").hexdigest()


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
    return os.path.join(cache_root(), "index", f"{encoder}-{_sha1(corpus_path)[:12]}")


def ensure_index(corpus_path: str = DEFAULT_CORPUS, encoder: str = DEFAULT_ENCODER, kind: str = "flat") -> str:
    """The cached index of (corpus, encoder): built on first use (or when cached in an older layout)
    from the shipped embeddings when they match, else by encoding the corpus (~8 min for 6.6k
    passages on 2 CPU cores)."""
    out = default_index_dir(corpus_path, encoder) + ("" if kind == "flat" else f"-{kind}")
    meta = os.path.join(out, META)
    if not os.path.isfile(meta) or _read_meta(meta).get("layout") != LAYOUT:
        build_index(corpus_path, encoder, out + ".tmp", kind, embeddings=shipped_embeddings(corpus_path, encoder))
        shutil.rmtree(out, ignore_errors=True)
        os.replace(out + ".tmp", out)
    return out


def _read_meta(path: str) -> dict:
    with open(path) as f:
        return json.load(f)


def gpu_index(index: faiss.Index, mode: str) -> faiss.Index:
    """`index` on every GPU faiss sees (sharded, fp16 storage: how Search-R1's server holds wiki-18)
    when `mode` is "on", or "auto" and faiss was built with GPUs; else `index` unchanged. Under "auto"
    an index type faiss cannot put on GPUs (HNSW) stays on the CPU."""
    if mode not in FAISS_GPU:
        raise UserError(f"faiss GPU mode {mode!r}; expected one of {', '.join(FAISS_GPU)}")
    gpus = faiss.get_num_gpus()
    if mode == "off" or (mode == "auto" and gpus == 0):
        return index
    if gpus == 0:
        raise UserError("--faiss-gpu=on but this faiss sees no GPU (faiss-cpu, or no CUDA device): install "
                        "faiss-gpu, or use --faiss-gpu=auto")
    options = faiss.GpuMultipleClonerOptions()
    options.shard, options.useFloat16 = True, True
    try:
        moved = faiss.index_cpu_to_all_gpus(index, co=options)
    except RuntimeError as e:
        if mode == "on":
            raise UserError(f"faiss cannot put this {type(index).__name__} on GPUs ({e}); "
                            "use --faiss-gpu=off") from None
        log.warning("faiss cannot put this %s on GPUs; searching on the CPU", type(index).__name__)
        return index
    log.info("faiss index on %d GPU(s), sharded, fp16", gpus)
    return moved


class Retriever:
    """In-process dense retriever over an index directory written by `build_index` or `adopt_index`.

    Passages are read by byte offset at each search (`CorpusFile`), never loaded all at once.
    Prefixes: None (or "") takes meta.json's, which are those the index's passages were encoded with."""

    def __init__(self, index_dir: str, encoder: Encoder | None = None, query_prefix: str | None = None,
                 passage_prefix: str | None = None, faiss_gpu: str = "off"):
        meta_path = os.path.join(index_dir, META)
        if not os.path.isfile(meta_path):
            raise FileNotFoundError(f"{meta_path} not found: build one with python -m launch.build_index "
                                    "(--adopt=e5_Flat.index --corpus=wiki-18.jsonl for Search-R1's)")
        self.meta = _read_meta(meta_path)
        if self.meta.get("retriever") == "lexical":
            raise UserError(f"{index_dir} is a lexical (SQLite FTS5) index: set retriever.kind=lexical "
                            "(launch.serve_retriever serves either kind)")
        if self.meta.get("layout") != LAYOUT:
            raise UserError(f"{index_dir} was written by an older launch.build_index (no passage offset table): "
                            f"run python -m launch.build_index --adopt={index_dir}/{INDEX} "
                            f"--corpus={index_dir}/{CORPUS} --encoder={self.meta.get('encoder')} --out=NEW_DIR")
        self._check_sources(index_dir)
        index = faiss.read_index(os.path.join(index_dir, INDEX))
        if hasattr(index, "nprobe"):
            index.nprobe = 16
        self.index = gpu_index(index, faiss_gpu)
        self.corpus = CorpusFile(os.path.join(index_dir, CORPUS), os.path.join(index_dir, self.meta["offsets"]))
        if self.index.ntotal != len(self.corpus):
            raise UserError(f"{index_dir}: index holds {self.index.ntotal} vectors for {len(self.corpus)} passages")
        self.encoder = encoder or Encoder(self.meta["encoder"],
                                          query_prefix=(self.meta["query_prefix"] if query_prefix is None
                                                        else query_prefix),
                                          passage_prefix=(self.meta["passage_prefix"] if passage_prefix is None
                                                          else passage_prefix))
        if self.encoder.dim != self.index.d:
            raise UserError(f"{index_dir}: index vectors are {self.index.d}-dimensional, encoder "
                            f"{self.encoder.name} makes {self.encoder.dim}")
        source = "given" if encoder is not None or query_prefix else f"{META}: {self.meta.get('prefix_source')}"
        log.info("retriever %s: %d passages, encoder %s, query prefix %r, passage prefix %r (%s)", index_dir,
                 len(self.corpus), self.encoder.name, self.encoder.query_prefix, self.encoder.passage_prefix, source)
        if passage_prefix and passage_prefix != self.meta["passage_prefix"]:
            log.warning("passage prefix %r given, but %s says the passages were encoded with %r", passage_prefix,
                        meta_path, self.meta["passage_prefix"])

    def _check_sources(self, index_dir: str) -> None:
        """The index and corpus files as meta.json recorded them: a corpus of another size would be
        read at wrong offsets, so it is refused; a changed mtime alone is reported."""
        for name, seen in self.meta["sources"].items():
            path = os.path.join(index_dir, name)
            if not os.path.exists(path):
                raise FileNotFoundError(f"{path} is missing (it was {seen['path']}): adopt or build the index again")
            st = os.stat(path)
            if st.st_size != seen["size"]:
                raise UserError(f"{os.path.realpath(path)} is {st.st_size} bytes, not the {seen['size']} it was when "
                                f"{index_dir} was written: run launch.build_index for it again")
            if st.st_mtime != seen["mtime"]:
                log.warning("%s was modified after %s was written", os.path.realpath(path), index_dir)

    def search(self, queries: list[str], topk: int = 3) -> list[list[tuple[dict, float]]]:
        if not queries:
            return []
        q = self.encoder.encode(list(queries), kind="query")
        scores, ids = self.index.search(q, topk)
        return [[(self.corpus[i], float(s)) for i, s in zip(row_ids, row_scores) if i >= 0]
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
