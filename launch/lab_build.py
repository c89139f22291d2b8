"""Build a lab world and its questions: OUT/world.json (entities, facts, passages), OUT/corpus.jsonl
(the Search-R1 corpus the retriever serves, one passage per entity), OUT/questions.jsonl (QA rows
with a "lab" field: hops, operation, gold chain, titles, intermediate values, answer) and
OUT/stats.json. The same seed writes the same files, byte for byte; another seed is a held-out world.

    python -m launch.lab_build --seed=0 --out=data/lab/world0
    python -m launch.lab_build --seed=1 --out=data/lab/world1 --per-cell=100 --size=small
"""

from __future__ import annotations

import json
import os
import time

from absl import flags

from launch._cli import Command

CLI = Command("launch.lab_build", __doc__)
F = CLI.flags
SEED = flags.DEFINE_integer("seed", 0, "the world's seed (0: the training world, 1: the held-out world)",
                            flag_values=F)
OUT = flags.DEFINE_string("out", None, "the folder to write (required)", flag_values=F)
SIZE = flags.DEFINE_enum("size", "default", ["default", "small"], "entities: default 3,500, small 350",
                         flag_values=F)
PER_CELL = flags.DEFINE_integer("per-cell", 200, "questions per (hops, op) cell", flag_values=F)
HOPS = flags.DEFINE_list("hops", ["1", "2", "3"], "the hops dial's settings", flag_values=F)
OPS = flags.DEFINE_list("ops", ["none", "compare", "diff", "sum", "count", "bool"], "the operation dial's settings",
                        flag_values=F)


def main(argv: list[str] | None = None) -> int:
    CLI.parse(argv)
    from dart_jax.data.corpus import write_jsonl
    from dart_jax.errors import UserError
    from dart_jax.lab.questions import make_questions, summary
    from dart_jax.lab.world import generate_world
    if not OUT.value:
        raise UserError("--out is required: the folder to write the world into (e.g. data/lab/world0)")
    if PER_CELL.value < 1:
        raise UserError(f"--per-cell={PER_CELL.value}: ask for at least 1 question per cell")
    try:
        hops = tuple(int(h) for h in HOPS.value)
    except ValueError:
        raise UserError(f"--hops={','.join(HOPS.value)}: give integers, e.g. --hops=1,2,3") from None
    t0 = time.perf_counter()
    world = generate_world(SEED.value, SIZE.value)
    rows = make_questions(world, PER_CELL.value, hops, tuple(OPS.value), seed=SEED.value)
    seconds = time.perf_counter() - t0
    sizes = world.save(OUT.value)
    write_jsonl(os.path.join(OUT.value, "questions.jsonl"), rows)
    sizes["questions.jsonl"] = os.path.getsize(os.path.join(OUT.value, "questions.jsonl"))
    stats = summary(world, rows)
    with open(os.path.join(OUT.value, "stats.json"), "w", encoding="utf-8") as f:
        json.dump(stats, f, indent=1, sort_keys=True)
        f.write("\n")
    print(f"lab world {SEED.value}: {stats['entities']} entities, {len(rows)} questions in {seconds:.1f} s; "
          + ", ".join(f"{k} {v / 1e6:.2f} MB" for k, v in sizes.items()) + f" -> {OUT.value}")
    return 0


if __name__ == "__main__":
    CLI.run(main)
