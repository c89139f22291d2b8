"""Serve POST /retrieve (Search-R1's retrieval-server contract) on loopback. Without --index, the
embedded MiniLM index over the shipped corpus (built on first use).

    python -m launch.serve_retriever --port=8000
    python -m launch.serve_retriever --index=indexes/wiki18_e5 --port=8000   # from launch.build_index --adopt
    python -m launch.serve_retriever --index=runs/index --host=0.0.0.0       # exposed beyond loopback
    python -m launch.serve_retriever --index=DIR   # a lexical (SQLite FTS5 BM25) one: build_index --kind=lexical

Queries get the prefix the index's meta.json records (E5: "query: "); --query-prefix overrides it.
faiss moves the index to the GPUs when it was built with GPU support (--faiss-gpu=auto). Search-R1's
own search_r1/search/retrieval_server.py answers the same POST /retrieve contract: a run's
retriever.url may point at either.
"""

from __future__ import annotations

from absl import flags

from launch._cli import Command, check_port

CLI = Command("launch.serve_retriever", __doc__)
F = CLI.flags
INDEX = flags.DEFINE_string("index", None, "an index directory (launch.build_index), dense or lexical", flag_values=F)
KIND = flags.DEFINE_enum("kind", None, ["dense", "lexical"], "without --index: which index of the shipped corpus "
                         "(default dense); with --index its meta.json says", flag_values=F)
HOST = flags.DEFINE_string("host", "127.0.0.1", "loopback by default; 0.0.0.0 exposes it", flag_values=F)
PORT = flags.DEFINE_integer("port", 8000, "port", flag_values=F)
MAX_BATCH = flags.DEFINE_integer("max-batch", 512, "queries per request at most", flag_values=F)
BATCH_QUERIES = flags.DEFINE_integer("batch-queries", 256, "queries per encoder call (concurrent requests are "
                                     "batched together)", flag_values=F)
MAX_WAIT_MS = flags.DEFINE_float("max-wait-ms", 5.0, "how long a batch waits for more requests", flag_values=F)
QUERY_PREFIX = flags.DEFINE_string("query-prefix", None, "text put before each query (default: the index's "
                                   "meta.json)", flag_values=F)
PASSAGE_PREFIX = flags.DEFINE_string("passage-prefix", None, "the prefix the passages were encoded with "
                                     "(default: the index's meta.json; recorded, searches do not use it)",
                                     flag_values=F)
FAISS_GPU = flags.DEFINE_enum("faiss-gpu", "auto", ["auto", "on", "off"], "put the faiss index on the GPUs: auto "
                              "when faiss has GPU support, on (fail without), off", flag_values=F)


def main(argv: list[str] | None = None) -> int:
    CLI.parse(argv)
    check_port(HOST.value, PORT.value)  # a port in use: one line now, not after the index and encoder load
    for flag in (MAX_BATCH, BATCH_QUERIES):
        if flag.value < 1:
            raise SystemExit(f"--{flag.name}={flag.value}: must be ≥ 1")
    if MAX_WAIT_MS.value < 0:
        raise SystemExit(f"--max-wait-ms={MAX_WAIT_MS.value}: must be ≥ 0")
    from dart_jax.tools.lexical import LexicalRetriever, ensure_lexical_index, index_kind
    from dart_jax.tools.retrieval import Retriever, ensure_index
    from dart_jax.tools.retrieval_server import RetrievalServer, ServerLimits
    limits = ServerLimits(max_batch=MAX_BATCH.value, batch_queries=BATCH_QUERIES.value, max_wait_ms=MAX_WAIT_MS.value)
    kind = index_kind(INDEX.value) if INDEX.value else (KIND.value or "dense")
    if KIND.value and KIND.value != kind:
        raise SystemExit(f"--kind={KIND.value} but {INDEX.value} holds a {kind} index; drop --kind")
    if kind == "lexical":
        dense_only = [f"--{f.name}" for f in (QUERY_PREFIX, PASSAGE_PREFIX, FAISS_GPU) if F[f.name].present]
        if dense_only:
            raise SystemExit(f"{', '.join(dense_only)}: for a dense index; a lexical one has no encoder")
        retriever = LexicalRetriever(INDEX.value or ensure_lexical_index())
        server = RetrievalServer(retriever, HOST.value, PORT.value, limits)
        print(f"lexical (SQLite FTS5 BM25): {len(retriever)} passages", flush=True)
    else:
        retriever = Retriever(INDEX.value or ensure_index(), query_prefix=QUERY_PREFIX.value,
                              passage_prefix=PASSAGE_PREFIX.value, faiss_gpu=FAISS_GPU.value)
        server = RetrievalServer(retriever, HOST.value, PORT.value, limits)
        print(f"encoder {retriever.encoder.name}: query prefix {retriever.encoder.query_prefix!r}, passage prefix "
              f"{retriever.encoder.passage_prefix!r}; {len(retriever.corpus)} passages", flush=True)
    try:
        server.serve_forever(on_ready=lambda s: print(f"serving POST {s.url} (GET /health)", flush=True))
    except KeyboardInterrupt:
        pass
    return 0


if __name__ == "__main__":
    CLI.run(main)
