"""Capability Effect Attribution (METHOD §2): solve per-question β from the six variants' sampled
accuracies and report it with its uncertainty (dart_jax/analysis/cea.py).

    python -m launch.cea --stage=solve --inputs=runs/cea/accuracy --out=runs/cea/solve
    python -m launch.cea --stage=solve --inputs=base=EVAL_DIR --inputs=reas=EVAL_DIR ... --out=DIR

--inputs: a directory holding one sub-directory per variant (base, reas, tool, unified, h_tool,
h_reas), or `variant=PATH` six times; each PATH is `launch.evaluate --n-samples N`'s output
directory or its per_question_accuracy.jsonl. Writes report.md, summary.json, beta.csv,
per_question.jsonl and three PNGs to --out.
"""

from __future__ import annotations

import os

from absl import flags

from launch._cli import Command

CLI = Command("launch.cea", __doc__)
F = CLI.flags
STAGE = flags.DEFINE_enum("stage", "solve", ["solve"], "the stage to run", flag_values=F)
INPUTS = flags.DEFINE_multi_string("inputs", [], "a directory of six variant sub-directories, or variant=PATH "
                                   "(repeated)", flag_values=F)
OUT = flags.DEFINE_string("out", None, "output directory", flag_values=F)
ESTIMATOR = flags.DEFINE_enum("estimator", "clip", ["clip", "jeffreys"], "accuracy estimator for beta.csv and "
                              "the figures (summary.json and report.md carry both)", flag_values=F)
N_BOOT = flags.DEFINE_integer("n-boot", 10_000, "bootstrap resamples", flag_values=F)
SEED = flags.DEFINE_integer("seed", 0, "bootstrap seed", flag_values=F)
TITLE = flags.DEFINE_string("title", "CEA", "report title", flag_values=F)


def parse_inputs(values: list[str]) -> dict[str, str]:
    from dart_jax.analysis.cea import VARIANTS
    if len(values) == 1 and "=" not in values[0]:
        root = values[0]
        if not os.path.isdir(root):
            raise FileNotFoundError(f"--inputs {root}: not a directory")
        return {v: os.path.join(root, v) for v in VARIANTS}
    out = {}
    for item in values:
        if "=" not in item:
            raise ValueError(f"--inputs {item!r}: expected variant=PATH (or one directory of variant sub-directories)")
        v, path = item.split("=", 1)
        if v in out:
            raise ValueError(f"--inputs names variant {v!r} twice")
        out[v] = path
    return out


def main(argv: list[str] | None = None) -> int:
    CLI.parse(argv)
    if not INPUTS.value or not OUT.value:
        raise SystemExit("launch.cea --stage=solve needs --inputs and --out (--help)")
    from dart_jax.analysis.cea_report import read_inputs, solve_and_report
    counts = read_inputs(parse_inputs(INPUTS.value))
    s = solve_and_report(counts, OUT.value, ESTIMATOR.value, N_BOOT.value, SEED.value, TITLE.value)
    b = s[ESTIMATOR.value]["b23"]
    print(f"{s['kept']} questions kept ({s['dropped']} dropped): β23 mean {b['mean']:+.3f} "
          f"[{b['mean_ci'][0]:+.3f}, {b['mean_ci'][1]:+.3f}], {b['share_negative']:.0%} negative "
          f"[{b['share_negative_ci'][0]:.0%}, {b['share_negative_ci'][1]:.0%}], sign test p = {b['sign_test_p']:.3g}")
    print(f"report: {os.path.join(OUT.value, 'report.md')}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
