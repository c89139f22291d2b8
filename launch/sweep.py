"""python -m launch.sweep --config=configs/quickstart.py --mesh=8,1,1 --mesh=2,4,1 [--length=512] [--csv=FILE]

Compile time, step time and memory per device of the GRPO train step for each mesh shape. On a
CPU-only machine the host is split into as many devices as the largest mesh needs."""

from __future__ import annotations

import math
import os
import sys


def _meshes(argv) -> list[tuple[int, int, int]]:
    out = []
    for a in argv:
        if a.startswith("--mesh="):
            out.append(tuple(int(x) for x in a.split("=", 1)[1].split(",")))
    return out


def main() -> None:
    shapes = _meshes(sys.argv[1:])
    need = max((math.prod(s) for s in shapes), default=1)
    if "--xla_force_host_platform_device_count" not in os.environ.get("XLA_FLAGS", ""):
        os.environ["XLA_FLAGS"] = (os.environ.get("XLA_FLAGS", "") +
                                   f" --xla_force_host_platform_device_count={need}").strip()

    from absl import app, flags
    from ml_collections import config_flags

    config = config_flags.DEFINE_config_file("config", None, "an ml_collections config file")
    flags.DEFINE_multi_string("mesh", [], "data,fsdp,tensor (repeat for several shapes)")
    length = flags.DEFINE_integer("length", 512, "tokens per trajectory")
    steps = flags.DEFINE_integer("steps", 3, "timed steps per mesh (the first is excluded from the median)")
    out_csv = flags.DEFINE_string("csv", "", "also write the rows to this CSV file")

    def run(argv):
        del argv
        from dart_jax.bench.sweep import sweep_mesh, table, write_csv
        if not shapes:
            raise app.UsageError("give at least one --mesh=data,fsdp,tensor")
        rows = sweep_mesh(config.value, shapes, length.value, steps.value)
        print(table(rows))
        if out_csv.value:
            write_csv(rows, out_csv.value)
            print(f"wrote {out_csv.value}")

    flags.mark_flag_as_required("config")
    app.run(run)


if __name__ == "__main__":
    main()
