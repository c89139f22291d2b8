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


def main(argv: list[str] | None = None) -> int:
    CLI.parse(argv)
    from dart_jax.tools.retrieval import Retriever, ensure_index
    from dart_jax.tools.retrieval_server import make_server
    server = make_server(Retriever(INDEX.value or ensure_index()), HOST.value, PORT.value, MAX_BATCH.value)
    print(f"serving POST http://{HOST.value}:{server.server_address[1]}/retrieve", flush=True)
    try:
        server.serve_forever()
    except KeyboardInterrupt:
        pass
    return 0


if __name__ == "__main__":
    sys.exit(main())
