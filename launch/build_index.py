"""Make a retrieval index directory: encode a Search-R1 corpus (JSONL rows {"id", "contents"}) into a
faiss index, or adopt a published index as it is (Search-R1's e5_Flat.index + wiki-18.jsonl: linked,
not copied or re-encoded). Either way the directory is what launch.serve_retriever --index reads.

    python -m launch.build_index --out=runs/index
    python -m launch.build_index --corpus=wiki18.jsonl --encoder=/models/e5-base-v2 --kind=hnsw --out=DIR
    python -m launch.build_index --adopt=PATH/e5_Flat.index --corpus=PATH/wiki-18.jsonl \\
        --encoder=intfloat/e5-base-v2 --out=indexes/wiki18_e5
    python -m launch.build_index --kind=lexical --corpus=lab.jsonl --out=DIR   # SQLite FTS5 BM25, no encoder

The encoder is an embedded name, a directory or a hub id found in the local Hugging Face cache.
E5's "query: " / "passage: " prefixes are detected from the encoder's files (the log says which one
decided); --query-prefix / --passage-prefix override them.
"""

from __future__ import annotations

from absl import flags

from dart_jax.tools.retrieval import DEFAULT_CORPUS, DEFAULT_ENCODER, INDEX_KINDS
from launch._cli import Command

CLI = Command("launch.build_index", __doc__)
F = CLI.flags
ADOPT = flags.DEFINE_string("adopt", None, "a faiss index file to adopt instead of encoding (Search-R1's "
                            "e5_Flat.index); --corpus is then the corpus it was built from", flag_values=F)
CORPUS = flags.DEFINE_string("corpus", DEFAULT_CORPUS, 'JSONL rows {"id", "contents"}', flag_values=F)
ENCODER = flags.DEFINE_string("encoder", DEFAULT_ENCODER, "BERT-family encoder: HF directory, hub id "
                              "(intfloat/e5-base-v2) or embedded name", flag_values=F)
OUT = flags.DEFINE_string("out", None, "index directory (required)", flag_values=F)
KIND = flags.DEFINE_enum("kind", "flat", [*INDEX_KINDS, "lexical"], "faiss index kind, or lexical: an SQLite FTS5 "
                         "BM25 index (serve it, or use it with --config.retriever.kind=lexical)", flag_values=F)
BATCH = flags.DEFINE_integer("batch", 128, "passages per encoder batch", flag_values=F)
NLIST = flags.DEFINE_integer("nlist", None, "IVF lists (ivfpq)", flag_values=F)
PQ_M = flags.DEFINE_integer("pq-m", None, "PQ sub-quantizers (ivfpq)", flag_values=F)
SAVE = flags.DEFINE_string("save-embeddings", None, "also save passage embeddings (float16 .npy)", flag_values=F)
QUERY_PREFIX = flags.DEFINE_string("query-prefix", None, "text put before each query (default: detected from "
                                   "the encoder, \"query: \" for E5)", flag_values=F)
PASSAGE_PREFIX = flags.DEFINE_string("passage-prefix", None, "text put before each passage (default: detected "
                                     "from the encoder, \"passage: \" for E5)", flag_values=F)


def main(argv: list[str] | None = None) -> int:
    CLI.parse(argv)
    from dart_jax.errors import UserError
    from dart_jax.tools.retrieval import adopt_index, build_index
    if not OUT.value:
        raise UserError("--out=DIR is required: the index directory to write")
    prefixes = {"query_prefix": QUERY_PREFIX.value, "passage_prefix": PASSAGE_PREFIX.value}  # None: detect; "": none
    if ADOPT.value:
        encoding_only = [f"--{name}" for name in ("kind", "batch", "nlist", "pq-m", "save-embeddings")
                         if F[name].present]
        if encoding_only:
            raise UserError(f"{', '.join(encoding_only)}: for encoding a corpus, not for --adopt (an adopted index is "
                            f"served as it is); drop {'it' if len(encoding_only) == 1 else 'them'}")
        out = adopt_index(ADOPT.value, CORPUS.value, ENCODER.value, OUT.value, **prefixes)
        print(f"adopted {ADOPT.value} and {CORPUS.value} into {out} (linked, not copied)")
        return 0
    if KIND.value == "lexical":
        dense_only = [f"--{name}" for name in ("encoder", "batch", "nlist", "pq-m", "save-embeddings", "query-prefix",
                                               "passage-prefix") if F[name].present]
        if dense_only:
            raise UserError(f"{', '.join(dense_only)}: for a dense index, not for --kind=lexical; drop "
                            f"{'it' if len(dense_only) == 1 else 'them'}")
        from dart_jax.tools.lexical import build_lexical_index
        print(f"lexical index written to {build_lexical_index(CORPUS.value, OUT.value)}")
        return 0
    out = build_index(CORPUS.value, ENCODER.value, OUT.value, KIND.value, BATCH.value, NLIST.value, PQ_M.value,
                      save_embeddings=SAVE.value, **prefixes)
    print(f"index written to {out}")
    return 0


if __name__ == "__main__":
    CLI.run(main)
