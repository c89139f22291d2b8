"""Encode a Search-R1 corpus (JSONL rows {"id", "contents"}) and write a faiss index.

    python -m launch.build_index --out=runs/index
    python -m launch.build_index --corpus=wiki18.jsonl --encoder=/models/e5-base-v2 --kind=hnsw --out=DIR
"""

from __future__ import annotations

import sys

from absl import flags

from dart_jax.tools.retrieval import DEFAULT_CORPUS, DEFAULT_ENCODER, INDEX_KINDS
from launch._cli import Command

CLI = Command("launch.build_index", __doc__)
F = CLI.flags
CORPUS = flags.DEFINE_string("corpus", DEFAULT_CORPUS, 'JSONL rows {"id", "contents"}', flag_values=F)
ENCODER = flags.DEFINE_string("encoder", DEFAULT_ENCODER, "BERT-family HF directory or embedded name", flag_values=F)
OUT = flags.DEFINE_string("out", None, "index directory (required)", flag_values=F)
KIND = flags.DEFINE_enum("kind", "flat", list(INDEX_KINDS), "faiss index kind", flag_values=F)
BATCH = flags.DEFINE_integer("batch", 128, "passages per encoder batch", flag_values=F)
NLIST = flags.DEFINE_integer("nlist", None, "IVF lists (ivfpq)", flag_values=F)
PQ_M = flags.DEFINE_integer("pq-m", None, "PQ sub-quantizers (ivfpq)", flag_values=F)
SAVE = flags.DEFINE_string("save-embeddings", None, "also save passage embeddings (float16 .npy)", flag_values=F)


def main(argv: list[str] | None = None) -> int:
    CLI.parse(argv)
    if not OUT.value:
        raise SystemExit("launch.build_index: --out=DIR is required")
    from dart_jax.tools.retrieval import build_index
    out = build_index(CORPUS.value, ENCODER.value, OUT.value, KIND.value, BATCH.value, NLIST.value, PQ_M.value,
                      save_embeddings=SAVE.value)
    print(f"index written to {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
