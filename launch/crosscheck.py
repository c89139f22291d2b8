"""python -m launch.crosscheck {model,adapters,loss,step} --model <hf dir | gguf | smollm2-135m-instruct> [--json]

Every quantity dart_jax shares with PyTorch, on identical inputs, with its fp32 and bf16 tolerance:

    model     logits, log-probs, greedy continuation vs transformers
    adapters  routed logits and adapter gradients vs transformers + a hand-written routed-LoRA reference
              (--adapters DIR: a DART directory; default: fresh adapters with B ~ N(0, 0.02²))
    loss      one GRPO trajectory batch: advantages, log-probs, entropy, ratio, pg loss / KL / entropy in
              every aggregation mode, total loss and gradients vs a PyTorch implementation of REFERENCE §1–6
    step      three full updates (clipping, AdamW, warmup) vs torch.optim.AdamW: parameters after each

--reference verl|search_r1|dart_authors sets that system's conventions (both sides) and lists every
difference from ours. --tol KEY=VALUE (repeatable) holds a quantity class to your tolerance instead of
ours (keys: advantages, logp, entropy, ratio, loss, grad, grad_max, params, params_lr, logits,
adapter_grad; for the run's --dtype); an unknown key is an error. The old --logit-tol / --grad-tol
mean --tol logits= / --tol adapter_grad=. The report is printed (--json: as JSON) and saved as report.md / report.json
under --out (default runs/crosscheck/<check>-<model>). Exit status 1 when a quantity fails.
The old form `--model X [--adapters DIR]` (no subcommand) still runs `model` / `adapters`.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile

CHECKS = ("model", "adapters", "loss", "step")


def _parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(description="dart_jax vs PyTorch on the same inputs, quantity by quantity")
    sub = ap.add_subparsers(dest="check", required=True)
    for name in CHECKS:
        p = sub.add_parser(name)
        p.add_argument("--model", required=True, help="HF directory, .gguf file or embedded model name")
        p.add_argument("--json", action="store_true", help="print the report as JSON")
        p.add_argument("--out", default=None, help="directory for report.md / report.json")
        p.add_argument("--tol", action="append", default=[], metavar="KEY=VALUE",
                       help="hold quantities of class KEY to VALUE (see dart_jax/parity/report.py TOLERANCES)")
        if name == "model":
            p.add_argument("--prompts", default=None, help="jsonl with 'messages' or 'prompt' per line")
            p.add_argument("--max-new-tokens", type=int, default=32)
        if name == "adapters":
            p.add_argument("--adapters", default=None, help="a DART adapter directory (default: fresh, B ≠ 0)")
        if name in ("loss", "step"):
            p.add_argument("--dtype", choices=("float32", "bfloat16"), default="float32")
            p.add_argument("--reference", choices=("dart_jax", "verl", "search_r1", "dart_authors"), default="dart_jax")
            p.add_argument("--temperature", type=float, default=1.0)
            p.add_argument("--micro-batch", type=int, default=2, help="rows per micro-batch (4 trajectories)")
            p.add_argument("--seed", type=int, default=0)
    return ap


def run(args):
    from dart_jax.parity import report_convert
    if args.check == "model":
        from dart_jax.parity.crosscheck import crosscheck_model
        return report_convert.model_report(crosscheck_model(args.model, args.prompts, args.max_new_tokens))
    if args.check == "adapters":
        from dart_jax.parity.adapters_check import crosscheck_adapters
        directory = args.adapters
        if directory is None:
            from dart_jax.adapters.bootstrap import init_dart_directory
            directory = init_dart_directory(args.model, tempfile.mkdtemp(prefix="dart_xcheck_"), b_std=0.02)
        return report_convert.adapters_report(crosscheck_adapters(args.model, directory))
    import dataclasses

    from configs import base
    from dart_jax.parity.grpo_check import crosscheck_loss
    from dart_jax.parity.step_check import crosscheck_step
    from dart_jax.parity.references import apply_reference, loss_overrides
    from dart_jax.rl.step import LossConfig
    config = base.get()
    differences = apply_reference(config, args.reference)
    lc = dataclasses.replace(LossConfig(temperature=args.temperature), **loss_overrides(args.reference))
    fn = crosscheck_loss if args.check == "loss" else crosscheck_step
    return fn(args.model, args.dtype, lc=lc, micro_batch=args.micro_batch, reference=args.reference,
              differences=differences, seed=args.seed, response_length=int(config.rollout.max_response_tokens))


def _tolerances(pairs: list[str]) -> dict[str, float]:
    from dart_jax.parity.report import TOLERANCES
    out = {}
    for pair in pairs:
        key, sep, value = pair.partition("=")
        if not sep or key not in TOLERANCES:
            raise SystemExit(f"crosscheck: --tol {pair!r}: expected KEY=VALUE with KEY one of {sorted(TOLERANCES)}")
        try:
            out[key] = float(value)
        except ValueError:
            raise SystemExit(f"crosscheck: --tol {pair!r}: {value!r} is not a number") from None
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
                    raise SystemExit(f"crosscheck: {flag} needs a value")
                i, value = i + 1, argv[i + 1]
            out += ["--tol", f"{names[flag]}={value}"]
        else:
            out.append(argv[i])
        i += 1
    return out


def main(argv=None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if argv and argv[0].startswith("-") and argv[0] not in ("-h", "--help"):  # the old flag-only form
        argv = ["adapters" if any(a.startswith("--adapters") for a in argv) else "model"] + argv
    argv = _old_tolerance_flags(argv)
    args = _parser().parse_args(argv)
    from dart_jax.parity.report import tolerances
    with tolerances(_tolerances(args.tol), getattr(args, "dtype", "float32")):
        report = run(args)
    out = args.out or os.path.join("runs", "crosscheck",
                                   f"{args.check}-{os.path.basename(os.path.normpath(args.model))}")
    os.makedirs(out, exist_ok=True)
    with open(os.path.join(out, "report.md"), "w") as f:
        f.write(report.markdown())
    with open(os.path.join(out, "report.json"), "w") as f:
        json.dump(report.to_dict(), f, indent=2)
    print(json.dumps(report.to_dict(), indent=2) if args.json else report.markdown())
    print(f"report: {out}/report.md, {out}/report.json", file=sys.stderr)
    return 0 if report.passed else 1


if __name__ == "__main__":
    sys.exit(main())
