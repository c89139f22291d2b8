"""python -m launch.build_corpus --shared ../shared/data --out data

Rebuilds the shipped corpus (data/corpus/wiki_sample.jsonl), the training QA slices (data/qa/*.jsonl) and
the evaluation slices of launch.evaluate (data/qa, data/spider, data/bird; see dart_jax/data/eval_sets.py)."""

from __future__ import annotations

import argparse
import os
import sys

from dart_jax.data.corpus import build_from_shared, write_jsonl
from dart_jax.data.eval_sets import build_eval_sets


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--shared", default=os.path.join("..", "shared", "data"))
    ap.add_argument("--out", default="data")
    args = ap.parse_args(argv)
    corpus, nq, hotpot = build_from_shared(args.shared)
    n = write_jsonl(os.path.join(args.out, "corpus", "wiki_sample.jsonl"), corpus)
    write_jsonl(os.path.join(args.out, "qa", "nq_oracle.jsonl"), nq)
    write_jsonl(os.path.join(args.out, "qa", "hotpotqa_sample300.jsonl"), hotpot)
    print(f"corpus: {n} passages; nq: {len(nq)} questions; hotpotqa: {len(hotpot)} questions")
    for name, rows in build_eval_sets(args.shared, args.out).items():
        print(f"{name}: {rows} rows")
    return 0


if __name__ == "__main__":
    sys.exit(main())
