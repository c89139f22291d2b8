"""Write a new DART adapter directory (two PEFT adapters + the tag tokens and their rows) for a model.

    python -m launch.init_adapters --model=smollm2-135m-instruct --out=runs/dart0
    python -m launch.init_adapters --model=DIR --out=OUT --task=sql --b-std=0.02   # B ≠ 0, for cross-checks
"""

from __future__ import annotations

from absl import flags

from launch._cli import Command

CLI = Command("launch.init_adapters", __doc__)
F = CLI.flags
MODEL = flags.DEFINE_string("model", None, "model name or path (required)", flag_values=F)
OUT = flags.DEFINE_string("out", None, "adapter directory to write (required)", flag_values=F)
RANK = flags.DEFINE_integer("rank", 8, "LoRA rank per adapter", flag_values=F)
ALPHA = flags.DEFINE_float("alpha", 16.0, "LoRA alpha", flag_values=F)
SEED = flags.DEFINE_integer("seed", 0, "init seed", flag_values=F)
B_STD = flags.DEFINE_float("b-std", 0.0, "B ~ N(0, b_std²) instead of 0 (for cross-checks)", flag_values=F)
TASK = flags.DEFINE_enum("task", "qa", ["qa", "sql"], "router tags: <search> or <sql>", flag_values=F)


def main(argv: list[str] | None = None) -> int:
    CLI.parse(argv)
    if not MODEL.value or not OUT.value:
        raise SystemExit("launch.init_adapters: --model and --out are required; e.g. --model=smollm2-135m-instruct "
                         "--out=runs/dart0")
    from dart_jax.adapters.bootstrap import init_dart_directory
    from dart_jax.adapters.method import MethodSpec
    tags = ("<search>", "</search>") if TASK.value == "qa" else ("<sql>", "</sql>")
    out = init_dart_directory(MODEL.value, OUT.value, MethodSpec("dart", rank=RANK.value, alpha=ALPHA.value),
                              SEED.value, B_STD.value, *tags)
    print(f"wrote DART adapters to {out}")
    return 0


if __name__ == "__main__":
    CLI.run(main)
