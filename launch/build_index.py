"""python -m launch.build_index --corpus FILE.jsonl --encoder PATH --out DIR [--kind flat|hnsw|ivfpq]"""

from __future__ import annotations

import argparse
import sys

from dart_jax.tools.retrieval import DEFAULT_CORPUS, DEFAULT_ENCODER, INDEX_KINDS, build_index


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description="encode a Search-R1 corpus and write a faiss index")
    ap.add_argument("--corpus", default=DEFAULT_CORPUS, help='JSONL rows {"id", "contents"}')
    ap.add_argument("--encoder", default=DEFAULT_ENCODER, help="BERT-family HF directory or embedded name")
    ap.add_argument("--out", required=True)
    ap.add_argument("--kind", default="flat", choices=INDEX_KINDS)
    ap.add_argument("--batch-size", type=int, default=128)
    ap.add_argument("--nlist", type=int, default=None, help="IVF lists (ivfpq)")
    ap.add_argument("--pq-m", type=int, default=None, help="PQ sub-quantizers (ivfpq)")
    ap.add_argument("--save-embeddings", default=None, help="also save passage embeddings (float16 .npy)")
    args = ap.parse_args(argv)
    out = build_index(args.corpus, args.encoder, args.out, args.kind, args.batch_size, args.nlist, args.pq_m,
                      save_embeddings=args.save_embeddings)
    print(f"index written to {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
