"""Mesh-shape sweep of the GRPO train step: compile time, step time, memory per device and the train
state's bytes (fp32 masters + AdamW moments) for each (data, fsdp, tensor) shape. On a CPU-only
machine the host is split into as many devices as the largest mesh needs.

    python -m launch.sweep --config=configs/quickstart.py --mesh=1,1,1 --mesh=2,1,1 --mesh=1,2,1
    python -m launch.sweep --config=configs/quickstart.py --mesh=8,1,1 --length=512 --csv=sweep.csv

`--rollout=MODEL` adds the rollout sweep (dart_jax/bench/rollout_mesh.py): on each mesh, a prefill and a
decode segment with the sampler's state sharded on the mesh, for each decode layout (stacked,
per_layer, shared), with decode tokens/s and device memory against weights + KV cache. MODEL is
`config` (the config's model) or a random-init shape of the accelerator suite (`3b` = Qwen2.5-3B,
`small`, `tiny`); `--train=false` skips the train-step sweep; `--rollout-abstract` compiles the decode
without running it and reads XLA's memory analysis (a 3B model on a small host):

    python -m launch.sweep --config=configs/quickstart.py --mesh=1,1,1 --mesh=8,1,1 --mesh=2,1,4 \
        --rollout=3b --train=false --csv=rollout.csv
"""

from __future__ import annotations

import math
import os
import re
import sys

from absl import flags

from launch._cli import Command

CLI = Command("launch.sweep", __doc__, config=True, config_required=True)
MESH = flags.DEFINE_multi_string("mesh", [], "data,fsdp,tensor (repeat for several shapes)", flag_values=CLI.flags)
LENGTH = flags.DEFINE_integer("length", 512, "tokens per trajectory", flag_values=CLI.flags)
STEPS = flags.DEFINE_integer("steps", 3, "timed steps per mesh (the first is excluded from the median)",
                             flag_values=CLI.flags)
CSV = flags.DEFINE_string("csv", "", "also write the rows to this CSV file", flag_values=CLI.flags)
TRAIN = flags.DEFINE_boolean("train", True, "sweep the GRPO train step", flag_values=CLI.flags)
ROLLOUT = flags.DEFINE_string("rollout", "", "also sweep rollouts on this model: config | 3b | small | tiny",
                              flag_values=CLI.flags)
R_BATCH = flags.DEFINE_integer("rollout-batch", 16, "rollout rows", flag_values=CLI.flags)
R_PROMPT = flags.DEFINE_integer("rollout-prompt", 256, "prompt tokens per row", flag_values=CLI.flags)
R_NEW = flags.DEFINE_integer("rollout-new", 16, "decoded tokens per row", flag_values=CLI.flags)
R_ABSTRACT = flags.DEFINE_boolean("rollout-abstract", False, "rollout memory from XLA's memory analysis only "
                                  "(compile, allocate nothing, run nothing: models larger than the host)",
                                  flag_values=CLI.flags)
R_DTYPE = flags.DEFINE_string("rollout-dtype", "bfloat16", "dtype of a random-init rollout model",
                              flag_values=CLI.flags)


def main(argv: list[str] | None = None) -> int:
    CLI.parse(argv)
    shapes = [tuple(int(x) for x in m.split(",")) if re.fullmatch(r"\d+,\d+,\d+", m) else () for m in MESH.value]
    if not shapes or any(len(s) != 3 for s in shapes):
        raise SystemExit(f"launch.sweep: --mesh {MESH.value or '(none)'}: give at least one mesh as three "
                         "integers, e.g. --mesh=1,1,1 --mesh=2,1,1")
    need = max(math.prod(s) for s in shapes)
    if "jax" not in sys.modules and "--xla_force_host_platform_device_count" not in os.environ.get("XLA_FLAGS", ""):
        os.environ["XLA_FLAGS"] = (os.environ.get("XLA_FLAGS", "") +
                                   f" --xla_force_host_platform_device_count={need}").strip()
    from tqdm.auto import tqdm

    from dart_jax.bench.sweep import sweep_mesh, table, write_csv

    def meshes(what: str):
        """The shapes, one at a time, under a progress bar naming the mesh being compiled and run."""
        bar = tqdm(shapes, desc=what, unit="mesh", file=sys.stderr)
        for shape in bar:
            bar.set_postfix(mesh="x".join(map(str, shape)))
            yield shape

    rows = []
    if TRAIN.value:
        rows = [r for s in meshes("train-step sweep") for r in sweep_mesh(CLI.config.value, [s], LENGTH.value,
                                                                           STEPS.value)]
        print(table(rows))
    if ROLLOUT.value:
        from dart_jax.bench import rollout_mesh
        r_rows = [r for s in meshes("rollout sweep")
                  for r in rollout_mesh.sweep_for(CLI.config.value, ROLLOUT.value, [s], R_BATCH.value, R_PROMPT.value,
                                                  R_NEW.value, R_DTYPE.value, log=tqdm.write,
                                                  abstract=R_ABSTRACT.value)]
        print(rollout_mesh.table(r_rows))
        rows += [{"sweep": "rollout", **r} for r in r_rows]
    if CSV.value:
        write_csv(rows, CSV.value)
        print(f"wrote {CSV.value}")
    return 0


if __name__ == "__main__":
    CLI.run(main)
