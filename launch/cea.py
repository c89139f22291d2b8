"""Capability Effect Attribution (the paper's interference analysis) end to end: train M_Reas /
M_Tool / M_Unified, sample the six variants (with H_Tool / H_Reas composed from two models), solve
per-question β and report it with its uncertainty (dart_jax/experiments/cea_run.py, dart_jax/analysis/cea*.py).

    python -m launch.cea --config=configs/cea_quickstart.py                 # every stage still missing
    python -m launch.cea --config=configs/cea_quickstart.py --stage=train   # one stage (train|sample|solve)
    python -m launch.cea --config=configs/cea.py:qwen2.5-3b-base --config.model.path=DIR
    python -m launch.cea --stage=solve --inputs=runs/cea_quickstart/sample --out=DIR   # re-solve saved accuracies
    python -m launch.cea --stage=solve --inputs=base=EVAL_DIR --inputs=reas=EVAL_DIR ... --out=DIR

With --config, every stage writes under config.cea.out (train/<variant>/, sample/<variant>/, solve/,
stages.json with each stage's wall time; with cea.train_seeds, train/<variant>_s<seed>/ and
sample/<variant>_s<seed>/, solved per seed and pooled; with cea.screen, screen/ first:
dart_jax/experiments/cea_screen.py); a stage whose output exists is skipped, an interrupted
training run resumes from its newest checkpoint, so re-running the same command finishes the job.
--inputs: a directory holding one sub-directory per variant (base, reas, tool, unified, h_tool,
h_reas), or `variant=PATH` six times; each PATH is `launch.evaluate --n-samples N`'s output
directory or its per_question_accuracy.jsonl. The solve stage writes report.md, summary.json,
beta.csv, per_question.jsonl and three PNGs.

--gate (dart_jax/experiments/gate.py): each variant's sampled trajectories are checked for a template agent
(questions copied into the search, one <think> sentence, one tool-call shape); warn (default) flags it in
summary.json, report.md and here, strict refuses (M_Base is then sampled before training, and gated first),
off skips it. With --inputs, the variants whose directory holds per_question.jsonl are gated.

Multi-process: the same command on every process with --coordinator / --num-processes / --process-id
(or --distributed, as launch.train): training and sampling run across the processes (a shared
filesystem holds config.cea.out), process 0 decides what is done, writes the files and solves.
"""

from __future__ import annotations

import os

from absl import flags

from dart_jax.errors import UserError
from launch._cli import Command, define_distributed_flags

CLI = Command("launch.cea", __doc__, config=True)
F = CLI.flags
START = define_distributed_flags(CLI)
STAGE = flags.DEFINE_enum("stage", "all", ["all", "screen", "train", "sample", "solve"], "the stage to run (all: "
                          "every missing one, in order; screen: only with cea.screen)", flag_values=F)
INPUTS = flags.DEFINE_multi_string("inputs", [], "a directory of six variant sub-directories, or variant=PATH "
                                   "(repeated)", flag_values=F)
OUT = flags.DEFINE_string("out", None, "output directory (with --inputs)", flag_values=F)
ESTIMATOR = flags.DEFINE_enum("estimator", None, ["clip", "jeffreys"], "accuracy estimator for beta.csv and "
                              "the figures (summary.json and report.md carry both; default clip, or the "
                              "config's)", flag_values=F)
N_BOOT = flags.DEFINE_integer("n-boot", None, "bootstrap resamples (default 10,000, or the config's)", flag_values=F)
BOOT_SEED = flags.DEFINE_integer("boot-seed", None, "bootstrap seed (default 0, or the config's cea.boot_seed; the "
                                 "sampling seed is cea.seed)", flag_values=F)
TITLE = flags.DEFINE_string("title", None, "report title", flag_values=F)
B23_ONLY = flags.DEFINE_bool("interference-only", False, "solve: β23 alone from M_Base / M_Reas / M_Tool / "
                             "M_Unified (it never reads the compositions) into OUT/solve_b23, for a study whose "
                             "H_Tool / H_Reas were not sampled (yet); with training seeds, pooled as the full "
                             "solve pools them", flag_values=F)

GATE = flags.DEFINE_enum("gate", "warn", ["warn", "strict", "off"], "degeneracy gate on the sampled trajectories: "
                         "warn (flag it), strict (refuse), off", flag_values=F)


def parse_inputs(values: list[str]) -> dict[str, str]:
    from dart_jax.analysis.cea import VARIANTS
    if len(values) == 1 and "=" not in values[0]:
        root = values[0]
        if not os.path.isdir(root):
            raise FileNotFoundError(f"--inputs {root}: not a directory; give the directory of the six variants' "
                                    "evaluations, or variant=PATH six times")
        return {v: os.path.join(root, v) for v in VARIANTS}
    out = {}
    for item in values:
        if "=" not in item:
            raise UserError(f"--inputs {item!r}: expected variant=PATH (or one directory of variant sub-directories)")
        v, path = item.split("=", 1)
        if v in out:
            raise UserError(f"--inputs names variant {v!r} twice; give each variant once")
        out[v] = path
    return out


def _gate_inputs(inputs: dict[str, str]) -> dict | None:
    """--inputs: the gate over the variants whose evaluation directory holds per_question.jsonl."""
    if GATE.value == "off":
        return None
    from dart_jax.experiments import gate as dgate
    dirs = {v: p if os.path.isdir(p) else os.path.dirname(p) for v, p in inputs.items()}
    sets = {v: recs for v, d in dirs.items() if (recs := dgate.eval_records(d))}
    return dgate.enforce(dgate.study_gate(sets), GATE.value, "CEA")


def _print_gate(s: dict) -> None:
    from dart_jax.experiments.gate import KEY, line
    if s.get(KEY) is not None:
        print(line(s[KEY]).replace("**", ""))


def _print(s: dict, estimator: str, out: str) -> None:
    _print_gate(s)
    if "seed_means" in s:  # pooled over training seeds (analysis.cea_seeds)
        b, d = s["coefficients"]["b23"], s["decided"]
        print(f"seeds {s['seeds']}, {s['kept']} questions kept ({s['dropped']} dropped): β23 ({estimator}) mean "
              f"{b['mean']:+.3f} [{b['ci'][0]:+.3f}, {b['ci'][1]:+.3f}] over seeds × questions, per seed "
              + ", ".join(f"{x:+.3f}" for x in s["seed_means"]["b23"])
              + f"; sign decided at 90%: {d['negative']} negative, {d['positive']} positive of {d['questions']}")
        print(f"report: {os.path.join(out, 'report.md')}")
        return
    b = s[estimator]["b23"]
    print(f"{s['kept']} questions kept ({s['dropped']} dropped): β23 mean {b['mean']:+.3f} "
          f"[{b['mean_ci'][0]:+.3f}, {b['mean_ci'][1]:+.3f}], {b['share_negative']:.0%} negative "
          f"[{b['share_negative_ci'][0]:.0%}, {b['share_negative_ci'][1]:.0%}], sign test p = {b['sign_test_p']:.3g}")
    print(f"report: {os.path.join(out, 'report.md')}")


def main(argv: list[str] | None = None) -> int:
    CLI.parse(argv)
    config = CLI.config.value
    if INPUTS.value:  # re-solve saved accuracies, no config needed
        if STAGE.value not in ("solve", "all") or not OUT.value or config is not None:
            raise SystemExit("launch.cea --inputs solves saved accuracies: give --stage=solve and --out, without "
                             "--config (--help)")
        from dart_jax.analysis.cea_report import read_inputs, solve_and_report
        inputs = parse_inputs(INPUTS.value)
        counts = read_inputs(inputs)
        gate = _gate_inputs(inputs)
        est = ESTIMATOR.value or "clip"
        s = solve_and_report(counts, OUT.value, est, 10_000 if N_BOOT.value is None else N_BOOT.value,
                             BOOT_SEED.value or 0, TITLE.value or "CEA")
        if gate is not None:
            from dart_jax.experiments.gate import KEY, add_to_report
            add_to_report(OUT.value, gate)
            s[KEY] = gate
        _print(s, est, OUT.value)
        return 0
    if config is None:
        raise SystemExit("launch.cea needs --config=configs/cea_quickstart.py (or cea.py:MODEL), or --stage=solve "
                         "--inputs ... --out DIR (--help)")
    if "cea" not in config:
        raise SystemExit("launch.cea: the config has no `cea` section (configs/cea_quickstart.py and configs/cea.py "
                         "have one)")
    for field, flag in (("estimator", ESTIMATOR), ("n_boot", N_BOOT), ("boot_seed", BOOT_SEED), ("title", TITLE)):
        if flag.value is not None:
            config.cea[field] = flag.value
    if OUT.value:
        config.cea.out = OUT.value
    START()
    from dart_jax.experiments.cea_run import STAGES, CEAStages
    from dart_jax.parallel.distributed import is_main
    stages = CEAStages(config, gate=GATE.value)
    if B23_ONLY.value:
        if STAGE.value != "solve":
            raise SystemExit("launch.cea --interference-only goes with --stage=solve")
        s = stages.solve(interference_only=True)
        if not is_main():
            return 0
        if "seed_means" in s:  # pooled over training seeds
            _print(s, config.cea.estimator, os.path.join(config.cea.out, "solve_b23"))
            return 0
        _print_gate(s)
        b = s["clip"]["b23"]
        print(f"{s['kept']} questions kept ({s['dropped']} dropped): β23 mean {b['mean']:+.3f} "
              f"[{b['mean_ci'][0]:+.3f}, {b['mean_ci'][1]:+.3f}], {b['share_negative']:.0%} negative, "
              f"sign test p = {b['sign_test_p']:.3g}; report: {os.path.join(config.cea.out, 'solve_b23', 'report.md')}")
        return 0
    s = stages.run(STAGES if STAGE.value == "all" else (STAGE.value,))
    if not is_main():
        return 0
    for stage, items in stages.times().items():
        print(f"{stage}: " + ", ".join(f"{k} {v['seconds'] / 60:.1f} min" for k, v in items.items()))
    if s is not None:
        _print(s, config.cea.estimator, os.path.join(config.cea.out, "solve"))
    return 0


if __name__ == "__main__":
    CLI.run(main)
