"""Rebuild the shipped data from the benchmark files: the corpus (data/corpus/wiki_sample.jsonl), the
training QA slices (data/qa/*.jsonl) and the evaluation slices of launch.evaluate (data/qa,
data/spider, data/bird; dart_jax/data/eval_sets.py).

    python -m launch.build_corpus --shared=../shared/data --out=data
"""

from __future__ import annotations

import os

from absl import flags

from launch._cli import Command

CLI = Command("launch.build_corpus", __doc__)
SHARED = flags.DEFINE_string("shared", os.path.join("..", "shared", "data"), "the benchmark data folder",
                             flag_values=CLI.flags)
OUT = flags.DEFINE_string("out", "data", "the data folder to write", flag_values=CLI.flags)


def main(argv: list[str] | None = None) -> int:
    CLI.parse(argv)
    from dart_jax.data.corpus import build_from_shared, write_jsonl
    from dart_jax.data.eval_sets import build_eval_sets
    corpus, nq, hotpot = build_from_shared(SHARED.value)
    n = write_jsonl(os.path.join(OUT.value, "corpus", "wiki_sample.jsonl"), corpus)
    write_jsonl(os.path.join(OUT.value, "qa", "nq_oracle.jsonl"), nq)
    write_jsonl(os.path.join(OUT.value, "qa", "hotpotqa_sample300.jsonl"), hotpot)
    print(f"corpus: {n} passages; nq: {len(nq)} questions; hotpotqa: {len(hotpot)} questions")
    for name, rows in build_eval_sets(SHARED.value, OUT.value).items():
        print(f"{name}: {rows} rows")
    return 0


if __name__ == "__main__":
    CLI.run(main)
