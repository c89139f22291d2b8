"""The paper's methods compared at small scale: train DART, LoRA-16, full fine-tuning,
MixLoRA and 2-Agent with the same warm start, data, steps and seeds, evaluate each greedily on
held-out questions, and report EM with its spread over seeds, reward curves, step time and memory.

    python -m launch.methods --config=configs/methods_quickstart.py                 # every missing stage
    python -m launch.methods --config=configs/methods_quickstart.py --stage=train   # train | eval | archive | report
    python -m launch.methods --config=configs/methods_quickstart.py --config.methods.methods=dart,mixlora

Everything is written under config.methods.out (train/<method>_s<seed>/, eval/<method>_s<seed>/,
report/, stages.json); a run that reached train.steps and an evaluation already written are
skipped, an interrupted run resumes from its newest checkpoint, so re-running finishes the job.
Finished runs are also kept, small, in config.methods.archive (committed with the findings): an
archived run is not trained again, and the report reads it from there when `out` has lost it.
--gate (dart_jax/experiments/gate.py): each evaluation's trajectories checked for a template agent (questions
copied into the search, one <think> sentence, one tool-call shape): warn (default) flags it in the report and
here, strict refuses (the warm start is then evaluated before training, and gated first), off skips it.
"""

from __future__ import annotations

from absl import flags

from launch._cli import Command

CLI = Command("launch.methods", __doc__, config=True)
F = CLI.flags
STAGE = flags.DEFINE_enum("stage", "all", ["all", "train", "eval", "archive", "report"], "the stage to run "
                          "(all: every missing one, in order; archive: copy finished runs into "
                          "methods.archive)", flag_values=F)
GATE = flags.DEFINE_enum("gate", "warn", ["warn", "strict", "off"], "degeneracy gate on the evaluated trajectories: "
                         "warn (flag it), strict (refuse), off", flag_values=F)


def main(argv: list[str] | None = None) -> int:
    CLI.parse(argv)
    config = CLI.config.value
    if config is None or "methods" not in config:
        raise SystemExit("launch.methods needs --config=configs/methods_quickstart.py (a config with a `methods` "
                         "section; --help)")
    from dart_jax.experiments.methods_run import STAGES, MethodsStages
    stages = MethodsStages(config, gate=GATE.value)
    s = stages.run(STAGES if STAGE.value == "all" else (STAGE.value,))
    for stage, items in stages.times().items():
        print(f"{stage}: " + ", ".join(f"{k} {v['seconds'] / 60:.1f} min" for k, v in items.items()))
    if s is not None:
        from dart_jax.experiments.gate import KEY, line
        if s.get(KEY) is not None:
            print(line(s[KEY]).replace("**", ""))
        for m, e in s["methods"].items():
            print(f"{m}: avg EM {e['avg']['mean']:.3f} [{e['avg']['min']:.3f}, {e['avg']['max']:.3f}] over seeds "
                  f"{e['seeds']}, step {e['step_s']:.0f} s, train state {e['train_state_mib']:.0f} MiB")
        print(f"report: {s['files']['report']}")
    return 0


if __name__ == "__main__":
    CLI.run(main)
