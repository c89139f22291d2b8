"""Gradient alignment (the paper's interference analysis): angles between the reasoning-role and tool-role policy
gradients of one trajectory, against same-role angles across trajectories of one query, by the
paper's protocol and by the DART authors' (dart_jax/experiments/grad_*.py, dart_jax/analysis/grad_*.py).

    python -m launch.grad_angles --config=configs/grad_angles_quickstart.py            # every missing stage
    python -m launch.grad_angles --config=configs/grad_angles_quickstart.py --stage=grads --params=adapters
    python -m launch.grad_angles --config=configs/grad_angles_quickstart.py --protocol=authors
    python -m launch.grad_angles --config=configs/grad_angles_quickstart.py \
        --checkpoint=runs/quickstart --params=adapters --out=runs/grad_angles_dart   # a trained DART policy

Stages under config.grad_angles.out (or --out): sample (G rollouts per query until enough queries
have mixed outcomes), grads (per-role gradients per query; one file per query, so an interrupted
stage resumes), report (angles.csv, summary.json, report.md, figures). A stage whose output exists
is skipped; stages.json records each stage's wall time. --params / --protocol restrict the
config's lists for the grads stage (params: full = the whole backbone, under a checkpoint's adapters held
fixed if it has any; adapters = a shared LoRA, or the checkpoint's adapters); the report covers every parameter set and protocol whose gradients are on
disk. --gate (dart_jax/experiments/gate.py): the sampled trajectories checked for a template agent (questions
copied into the search, one <think> sentence, one tool-call shape): warn (default) flags it in the report and
here, strict refuses (sampling stops at the first chunk that shows it, before any gradient), off skips it.
"""  # noqa: E501 (--help text, printed as written)

from __future__ import annotations

import os

from absl import flags

from launch._cli import Command

CLI = Command("launch.grad_angles", __doc__, config=True, config_required=True)
F = CLI.flags
STAGE = flags.DEFINE_enum("stage", "all", ["all", "sample", "grads", "report"], "the stage to run (all: every "
                          "missing one, in order)", flag_values=F)
CHECKPOINT = flags.DEFINE_string("checkpoint", None, "a run directory, orbax checkpoint or DART adapter directory "
                                 "to analyse instead of the config's model (+ warm start)", flag_values=F)
STEP = flags.DEFINE_integer("step", None, "the checkpoint step (default: the newest)", flag_values=F)
MODEL = flags.DEFINE_string("model", None, "model path or registry name (sets config.model.path)", flag_values=F)
PARAMS = flags.DEFINE_multi_enum("params", [], ["full", "adapters"], "parameter sets (default: the config's "
                                 "grad_angles.params)", flag_values=F)
PROTOCOL = flags.DEFINE_multi_enum("protocol", [], ["paper", "authors"], "protocols (default: the config's "
                                   "grad_angles.protocols)", flag_values=F)
OUT = flags.DEFINE_string("out", None, "output directory (default config.grad_angles.out)", flag_values=F)
GATE = flags.DEFINE_enum("gate", "warn", ["warn", "strict", "off"], "degeneracy gate on the sampled trajectories: "
                         "warn (flag it), strict (refuse), off", flag_values=F)


def main(argv: list[str] | None = None) -> int:
    CLI.parse(argv)
    config = CLI.config.value
    if "grad_angles" not in config:
        raise SystemExit("launch.grad_angles: the config has no `grad_angles` section "
                         "(configs/grad_angles_quickstart.py has one)")
    if MODEL.value:
        config.model.path = MODEL.value
    if PARAMS.value:
        config.grad_angles.params = list(dict.fromkeys(PARAMS.value))
    if PROTOCOL.value:
        config.grad_angles.protocols = list(dict.fromkeys(PROTOCOL.value))
    if OUT.value:
        config.grad_angles.out = OUT.value
    from dart_jax.experiments.grad_run import STAGES, Study
    study = Study(config, CHECKPOINT.value, STEP.value, gate=GATE.value)
    s = study.run(STAGES if STAGE.value == "all" else (STAGE.value,))
    for stage, items in study.times().items():
        print(f"{stage}: " + ", ".join(f"{k} {v['seconds'] / 60:.1f} min" for k, v in items.items()))
    if s is not None:
        from dart_jax.experiments.gate import KEY, line
        if s.get(KEY) is not None:
            print(line(s[KEY]).replace("**", ""))
        for key, v in s["paper"].items():
            print(f"paper {key}: cross {v['cross'].get('median', float('nan')):.1f}°, same reasoning "
                  f"{v['same_reasoning'].get('median', float('nan')):.1f}°, same tool "
                  f"{v['same_tool'].get('median', float('nan')):.1f}°"
                  + (f", control {v['control'].get('median', float('nan')):.1f}°" if "control" in v else "")
                  + f" (medians over {v['queries']} queries' pairs)")
        for key, v in s["authors"].items():
            print(f"authors {key}: cross {v['flattened']['cross'].get('median', float('nan')):.1f}°, same "
                  f"{v['flattened']['same'].get('median', float('nan')):.1f}° "
                  f"({v['kept']}/{v['samples']} samples kept)")
        print(f"report: {os.path.join(config.grad_angles.out, 'report', 'report.md')}")
    return 0


if __name__ == "__main__":
    CLI.run(main)
