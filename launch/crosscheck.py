"""Every quantity dart_jax shares with PyTorch, on identical inputs, with its fp32 and bf16 tolerance.

    python -m launch.crosscheck model --model=smollm2-135m-instruct
    python -m launch.crosscheck loss --model=smollm2-135m-instruct --reference=verl --json
    python -m launch.crosscheck step --model=DIR --dtype=bfloat16 --tol=params=1e-2
    python -m launch.crosscheck all --model=smollm2-135m-instruct     # the four checks, one after another

    model     logits, log-probs, greedy continuation vs transformers
    adapters  routed logits and adapter gradients vs transformers + a hand-written routed-LoRA reference
              (--adapters DIR: a DART directory; default: fresh adapters with B ~ N(0, 0.02²))
    loss      one GRPO trajectory batch: advantages, log-probs, entropy, ratio, pg loss / KL / entropy in
              every aggregation mode, total loss and gradients vs a PyTorch implementation of verl's GRPO
              conventions (dart_jax/parity/torch_grpo.py)
    step      three RL steps of two mini-batch updates (clipping, AdamW, warmup on verl's clock) vs
              torch.optim.AdamW + LambdaLR stepped once per RL step: parameters and lr after each

--reference verl|search_r1|dart_authors sets that system's conventions (both sides) and lists every
difference from ours. --tol KEY=VALUE (repeatable) holds a quantity class to your tolerance instead of
ours (keys: advantages, logp, entropy, ratio, loss, grad, grad_max, params, params_lr, logits,
adapter_grad; for the run's --dtype); an unknown key is an error. The old --logit-tol / --grad-tol mean
--tol logits= / --tol adapter_grad=, and the old form `--model X [--adapters DIR]` (no check named)
runs `model` / `adapters`. Several checks (or `all`) run one after another with a progress bar.
Each report is printed (--json: as JSON) and saved as report.md / report.json under --out (with
several checks, --out/<check>; default runs/crosscheck/<check>-<model>). Exit status 1 when a
quantity fails.
"""

from __future__ import annotations

import json
import os
import sys
import tempfile

from absl import flags

from launch._cli import Command

CHECKS = ("model", "adapters", "loss", "step")
CLI = Command("launch.crosscheck", __doc__)
F = CLI.flags
MODEL = flags.DEFINE_string("model", None, "HF directory, .gguf file or embedded model name", flag_values=F)
JSON = flags.DEFINE_bool("json", False, "print the report as JSON", flag_values=F)
OUT = flags.DEFINE_string("out", None, "directory for report.md / report.json", flag_values=F)
TOL = flags.DEFINE_multi_string("tol", [], "KEY=VALUE: hold quantities of class KEY to VALUE "
                                "(dart_jax/parity/check_report.py TOLERANCES)", flag_values=F)
PROMPTS = flags.DEFINE_string("prompts", None, "model: jsonl with 'messages' or 'prompt' per line", flag_values=F)
MAX_NEW = flags.DEFINE_integer("max-new-tokens", 32, "model: greedy continuation length", flag_values=F)
ADAPTERS = flags.DEFINE_string("adapters", None, "adapters: a DART adapter directory (default: fresh, B ≠ 0)",
                               flag_values=F)
DTYPE = flags.DEFINE_enum("dtype", "float32", ["float32", "bfloat16"], "loss / step: compute dtype", flag_values=F)
REFERENCE = flags.DEFINE_enum("reference", "dart_jax", ["dart_jax", "verl", "search_r1", "dart_authors"],
                              "loss / step: the system whose conventions both sides use", flag_values=F)
TEMPERATURE = flags.DEFINE_float("temperature", 1.0, "loss / step: rollout temperature", flag_values=F)
MICRO = flags.DEFINE_integer("micro-batch", 2, "loss / step: rows per micro-batch (4 trajectories)", flag_values=F)
SEED = flags.DEFINE_integer("seed", 0, "loss / step: seed of the old / reference log-prob noise", flag_values=F)


def run(check: str):
    from dart_jax.parity import report_convert
    if check == "model":
        from dart_jax.parity.model_check import crosscheck_model
        return report_convert.model_report(crosscheck_model(MODEL.value, PROMPTS.value, MAX_NEW.value))
    if check == "adapters":
        from dart_jax.parity.adapters_check import crosscheck_adapters
        directory = ADAPTERS.value
        if directory is None:
            from dart_jax.adapters.bootstrap import init_dart_directory
            directory = init_dart_directory(MODEL.value, tempfile.mkdtemp(prefix="dart_xcheck_"), b_std=0.02)
        return report_convert.adapters_report(crosscheck_adapters(MODEL.value, directory))
    import dataclasses

    from configs import base
    from dart_jax.parity.loss_check import crosscheck_loss
    from dart_jax.parity.references import apply_reference, loss_overrides
    from dart_jax.parity.step_check import crosscheck_step
    from dart_jax.run.spec import LossConfig
    config = base.get()
    differences = apply_reference(config, REFERENCE.value)
    lc = dataclasses.replace(LossConfig(temperature=TEMPERATURE.value), **loss_overrides(REFERENCE.value))
    fn = crosscheck_loss if check == "loss" else crosscheck_step
    return fn(MODEL.value, DTYPE.value, lc=lc, micro_batch=MICRO.value, reference=REFERENCE.value,
              differences=differences, seed=SEED.value, response_length=int(config.rollout.max_response_tokens))


def _tolerances(pairs: list[str]) -> dict[str, float]:
    from dart_jax.parity.check_report import TOLERANCES
    out = {}
    for pair in pairs:
        key, sep, value = pair.partition("=")
        if not sep or key not in TOLERANCES:
            raise SystemExit(f"launch.crosscheck: --tol {pair!r}: expected KEY=VALUE with KEY one of "
                             f"{sorted(TOLERANCES)}")
        try:
            out[key] = float(value)
        except ValueError:
            raise SystemExit(f"launch.crosscheck: --tol {pair!r}: {value!r} is not a number; give e.g. "
                             f"--tol={key}=1e-3") from None
    return out


def _old_tolerance_flags(argv: list[str]) -> list[str]:
    """--logit-tol X / --grad-tol X (the old form) -> --tol logits=X / --tol adapter_grad=X."""
    names = {"--logit-tol": "logits", "--grad-tol": "adapter_grad"}
    out, i = [], 0
    while i < len(argv):
        flag, sep, value = argv[i].partition("=")
        if flag in names:
            if not sep:
                if i + 1 >= len(argv):
                    raise SystemExit(f"launch.crosscheck: {flag} needs a value, e.g. {flag}=1e-3")
                i, value = i + 1, argv[i + 1]
            out.append(f"--tol={names[flag]}={value}")
        else:
            out.append(argv[i])
        i += 1
    return out


def main(argv: list[str] | None = None) -> int:
    argv = _old_tolerance_flags(list(sys.argv[1:] if argv is None else argv))
    args = CLI.parse(argv)
    # no check named: the old form (`--model X [--adapters DIR]`)
    checks = list(CHECKS) if args == ["all"] else args or ["adapters" if ADAPTERS.value else "model"]
    unknown = [c for c in checks if c not in CHECKS]
    if unknown or len(set(checks)) < len(checks):
        raise SystemExit(f"launch.crosscheck: checks {args}: name each of {CHECKS} at most once, or all")
    if not MODEL.value:
        raise SystemExit("launch.crosscheck: --model is required; give an HF directory, a .gguf file or an embedded "
                         "name (smollm2-135m-instruct)")
    from tqdm.auto import tqdm

    from dart_jax.parity.check_report import tolerances
    tols, passed = _tolerances(TOL.value), True
    bar = tqdm(checks, desc="crosscheck", unit="check", file=sys.stderr)
    for check in bar:
        bar.set_description(f"crosscheck {check}")
        with tolerances(tols, DTYPE.value):
            report = run(check)
        out = (os.path.join(OUT.value, check) if OUT.value and len(checks) > 1 else OUT.value or
               os.path.join("runs", "crosscheck", f"{check}-{os.path.basename(os.path.normpath(MODEL.value))}"))
        os.makedirs(out, exist_ok=True)
        with open(os.path.join(out, "report.md"), "w") as f:
            f.write(report.markdown())
        with open(os.path.join(out, "report.json"), "w") as f:
            json.dump(report.to_dict(), f, indent=2)
        bar.write(json.dumps(report.to_dict(), indent=2) if JSON.value else report.markdown(), file=sys.stdout)
        bar.write(f"report: {out}/report.md, {out}/report.json", file=sys.stderr)
        passed = passed and report.passed
    return 0 if passed else 1


if __name__ == "__main__":
    CLI.run(main)
