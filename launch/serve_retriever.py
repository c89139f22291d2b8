"""Serve POST /retrieve (Search-R1's contract, REFERENCE §8) on loopback. Without --index, the embedded
MiniLM index over the shipped corpus (built on first use).

    python -m launch.serve_retriever --port=8000
    python -m launch.serve_retriever --index=runs/index --host=0.0.0.0   # exposed beyond loopback
"""

from __future__ import annotations

import sys

from absl import flags

from launch._cli import Command

CLI = Command("launch.serve_retriever", __doc__)
F = CLI.flags
INDEX = flags.DEFINE_string("index", None, "a faiss index directory (launch.build_index)", flag_values=F)
HOST = flags.DEFINE_string("host", "127.0.0.1", "loopback by default; 0.0.0.0 exposes it", flag_values=F)
PORT = flags.DEFINE_integer("port", 8000, "port", flag_values=F)
MAX_BATCH = flags.DEFINE_integer("max-batch", 512, "queries per request at most", flag_values=F)
BATCH_QUERIES = flags.DEFINE_integer("batch-queries", 256, "queries per encoder call (concurrent requests are "
                                     "batched together)", flag_values=F)
MAX_WAIT_MS = flags.DEFINE_float("max-wait-ms", 5.0, "how long a batch waits for more requests", flag_values=F)


def main(argv: list[str] | None = None) -> int:
    CLI.parse(argv)
    from dart_jax.tools.retrieval import Retriever, ensure_index
    from dart_jax.tools.retrieval_server import RetrievalServer, ServerLimits
    limits = ServerLimits(max_batch=MAX_BATCH.value, batch_queries=BATCH_QUERIES.value, max_wait_ms=MAX_WAIT_MS.value)
    server = RetrievalServer(Retriever(INDEX.value or ensure_index()), HOST.value, PORT.value, limits)
    try:
        server.serve_forever(on_ready=lambda s: print(f"serving POST {s.url} (GET /health)", flush=True))
    except KeyboardInterrupt:
        pass
    return 0


if __name__ == "__main__":
    sys.exit(main())
