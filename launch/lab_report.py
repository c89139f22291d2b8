"""Measure the lab: for each world, the generator's statistics (entities, passage and question lengths in
SmolLM2 tokens, questions per (hops, op) cell, answer types) and retrieval accuracy per query kind
(entity name, name + attribute word, the full question) for the lexical (SQLite FTS5 BM25) and the dense
(MiniLM) retriever, both built in a temporary folder. Writes one JSON file and prints a short table.

    python -m launch.lab_report --out=docs/results/data/lab/lab_report.json
    python -m launch.lab_report --worlds=0 --size=small --per-cell=5 --retrievers=lexical --out=/tmp/r.json
"""

from __future__ import annotations

import json
import os
import tempfile
import time

from absl import flags

from launch._cli import Command

CLI = Command("launch.lab_report", __doc__)
F = CLI.flags
OUT = flags.DEFINE_string("out", None, "the JSON file to write (required)", flag_values=F)
WORLDS = flags.DEFINE_list("worlds", ["0", "1"], "world seeds (0: the training world, 1: the held-out world)",
                           flag_values=F)
SIZE = flags.DEFINE_enum("size", "default", ["default", "small"], "entities: default 3,500, small 350",
                         flag_values=F)
PER_CELL = flags.DEFINE_integer("per-cell", 50, "questions per (hops, op) cell", flag_values=F)
RETRIEVERS = flags.DEFINE_list("retrievers", ["lexical", "dense"], "which retrievers to measure", flag_values=F)
ENCODER = flags.DEFINE_string("encoder", "all-minilm-l6-v2", "the dense retriever's encoder", flag_values=F)
TOKENIZER = flags.DEFINE_string("tokenizer", "smollm2-135m-instruct", "the tokenizer lengths are counted with "
                                "('' counts words)", flag_values=F)


def _searcher(kind: str, corpus: str, folder: str):
    if kind == "lexical":
        from dart_jax.tools.lexical import LexicalRetriever, build_lexical_index
        return LexicalRetriever(build_lexical_index(corpus, os.path.join(folder, "lexical")))
    from dart_jax.tools.retrieval import Retriever, build_index
    return Retriever(build_index(corpus, ENCODER.value, os.path.join(folder, "dense"), progress=False))


def _table(report: dict) -> str:
    lines = [f"{'world':<6}{'retriever':<10}{'query kind':<17}{'n':>6}{'top-1':>8}{'top-3':>8}  top-3 Wilson 95%"]
    for seed, w in report["worlds"].items():
        for kind, acc in w["retrieval"].items():
            for q, a in acc.items():
                lo, hi = a["top3"]["wilson"]
                lines.append(f"{seed:<6}{kind:<10}{q:<17}{a['total']:>6}{a['top1']['rate']:>8.3f}"
                             f"{a['top3']['rate']:>8.3f}  [{lo:.3f}, {hi:.3f}]")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    CLI.parse(argv)
    from dart_jax.errors import UserError
    from dart_jax.lab.questions import make_questions
    from dart_jax.lab.report import retrieval_accuracy, world_statistics
    from dart_jax.lab.world import generate_world
    if not OUT.value:
        raise UserError("--out is required: the JSON file to write (e.g. docs/results/data/lab/lab_report.json)")
    if PER_CELL.value < 1:
        raise UserError(f"--per-cell={PER_CELL.value}: ask for at least 1 question per cell")
    bad = [r for r in RETRIEVERS.value if r not in ("lexical", "dense")]
    if bad:
        raise UserError(f"--retrievers={','.join(RETRIEVERS.value)}: {bad} unknown; choose from lexical, dense")
    try:
        seeds = [int(s) for s in WORLDS.value]
    except ValueError:
        raise UserError(f"--worlds={','.join(WORLDS.value)}: give integer seeds, e.g. --worlds=0,1") from None
    tokenizer = None
    if TOKENIZER.value:
        from dart_jax.tokenization.tokenizer import load_tokenizer
        tokenizer = load_tokenizer(TOKENIZER.value)
    t_all = time.perf_counter()
    report = {"command": "python -m launch.lab_report " + " ".join(
        f"--{k}={','.join(v) if isinstance(v, list) else v}" for k, v in
        (("worlds", WORLDS.value), ("size", SIZE.value), ("per-cell", PER_CELL.value),
         ("retrievers", RETRIEVERS.value), ("encoder", ENCODER.value), ("tokenizer", TOKENIZER.value))),
        "tokenizer": TOKENIZER.value or None, "encoder": ENCODER.value, "worlds": {}, "seconds": {}}
    for seed in seeds:
        t0 = time.perf_counter()
        world = generate_world(seed, SIZE.value)
        rows = make_questions(world, PER_CELL.value, seed=seed)
        entry = {"statistics": world_statistics(world, rows, tokenizer), "retrieval": {}}
        report["seconds"][f"world{seed}_generate_and_statistics"] = round(time.perf_counter() - t0, 1)
        with tempfile.TemporaryDirectory(prefix="lab_report_") as tmp:
            world.save(tmp)
            for kind in RETRIEVERS.value:
                t0 = time.perf_counter()
                searcher = _searcher(kind, os.path.join(tmp, "corpus.jsonl"), tmp)
                t1 = time.perf_counter()
                entry["retrieval"][kind] = retrieval_accuracy(world, rows, searcher)
                report["seconds"][f"world{seed}_{kind}_index"] = round(t1 - t0, 1)
                report["seconds"][f"world{seed}_{kind}_queries"] = round(time.perf_counter() - t1, 1)
                if hasattr(searcher, "close"):
                    searcher.close()
        report["worlds"][str(seed)] = entry
    report["seconds"]["total"] = round(time.perf_counter() - t_all, 1)
    os.makedirs(os.path.dirname(os.path.abspath(OUT.value)), exist_ok=True)
    with open(OUT.value, "w", encoding="utf-8") as f:
        json.dump(report, f, indent=1)
        f.write("\n")
    for seed, w in report["worlds"].items():
        s = w["statistics"]
        print(f"world {seed}: {s['passages']} passages ({s['passage_length'].get('median')} {s['unit']} median), "
              f"{s['questions']} questions ({s['question_length_all'].get('median')} {s['unit']} median)")
    print(_table(report))
    print(f"{report['seconds']['total']:.0f} s -> {OUT.value}")
    return 0


if __name__ == "__main__":
    CLI.run(main)
