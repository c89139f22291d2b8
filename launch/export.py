"""Export a trained run for other servers and libraries: the DART adapter pair as PEFT directories on
the serving base, a merged single-role model per adapter, and the DART adapter directory this project
serves with per-token routing. What each is for: docs/serving.md.

    python -m launch.export --checkpoint=runs/quickstart --out=exports/quickstart
    python -m launch.export --checkpoint=runs/quickstart --out=exports/q --parts=base,peft --dtype=float16

OUT/
  base/              HF model: the base with the run's warm start merged and its trained tag rows
  peft/reasoning/    PEFT LoRA on base/ (PeftModel.from_pretrained(base, "peft/reasoning"))
  peft/tool/         PEFT LoRA on base/
  merged-reasoning/  HF model: base/ + the reasoning adapter merged (any stock server, one role)
  merged-tool/       HF model: base/ + the tool adapter merged
  dart/              the DART adapter directory (manifest, router tags): launch.serve --checkpoint=OUT/dart
  README.md          these lines, with the run's router tags and convention
"""

from __future__ import annotations

import os

from absl import flags

from launch._cli import Command

CLI = Command("launch.export", __doc__)
F = CLI.flags
CHECKPOINT = flags.DEFINE_string("checkpoint", None, "a run directory (launch.train), its adapters/ or "
                                 "checkpoints/, or a DART adapter directory", flag_values=F)
OUT = flags.DEFINE_string("out", None, "the folder to write (must not exist, or be empty)", flag_values=F)
PARTS = flags.DEFINE_list("parts", ["base", "peft", "merged", "dart"], "which exports (base, peft, merged, "
                          "dart); peft needs base", flag_values=F)
DTYPE = flags.DEFINE_enum("dtype", "float32", ["float32", "float16"], "stored precision of adapters and models",
                          flag_values=F)
PARTS_KNOWN = ("base", "peft", "merged", "dart")


def main(argv: list[str] | None = None) -> int:
    CLI.parse(argv)
    if not CHECKPOINT.value or not OUT.value:
        raise SystemExit("--checkpoint=RUN and --out=DIR are required")
    unknown = sorted(set(PARTS.value) - set(PARTS_KNOWN))
    if unknown:
        raise SystemExit(f"--parts: unknown {unknown}; expected some of {list(PARTS_KNOWN)}")
    if "peft" in PARTS.value and "base" not in PARTS.value:
        raise SystemExit("--parts: peft sits on the exported base: add base (--parts=base,peft)")
    if os.path.exists(OUT.value) and os.listdir(OUT.value):
        raise SystemExit(f"--out={OUT.value} exists and is not empty: pick a new folder")
    from dart_jax.eval.policy import load_eval_policy
    from dart_jax.run.policy import run_mesh
    from dart_jax.serve.export import export_policy
    from launch._served import run_spec_of
    spec = run_spec_of(CHECKPOINT.value)
    policy = load_eval_policy(spec, run_mesh(spec), CHECKPOINT.value)
    written = export_policy(policy, spec, OUT.value, set(PARTS.value), DTYPE.value, CHECKPOINT.value)
    for part, path in written.items():
        print(f"{part:<17} {path}")
    return 0


if __name__ == "__main__":
    CLI.run(main)
