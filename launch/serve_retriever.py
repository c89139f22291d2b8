"""python -m launch.serve_retriever [--index DIR] [--host 127.0.0.1] [--port 8000]

Serves POST /retrieve (Search-R1 contract). Without --index, the embedded MiniLM index over the
shipped corpus (built on first use)."""

from __future__ import annotations

import argparse
import sys

from dart_jax.tools.retrieval import Retriever, ensure_index
from dart_jax.tools.retrieval_server import make_server


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--index", default=None)
    ap.add_argument("--host", default="127.0.0.1", help="loopback by default; 0.0.0.0 exposes it")
    ap.add_argument("--port", type=int, default=8000)
    ap.add_argument("--max-batch", type=int, default=512)
    args = ap.parse_args(argv)
    server = make_server(Retriever(args.index or ensure_index()), args.host, args.port, args.max_batch)
    print(f"serving POST http://{args.host}:{server.server_address[1]}/retrieve", flush=True)
    try:
        server.serve_forever()
    except KeyboardInterrupt:
        pass
    return 0


if __name__ == "__main__":
    sys.exit(main())
