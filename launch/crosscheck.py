"""python -m launch.crosscheck --model <hf dir | gguf file | smollm2-135m-instruct> [--prompts FILE]
[--adapters DIR] [--json]

Without --adapters: the plain model (logits, log-probs, greedy tokens). With --adapters DIR (a DART
adapter directory, see launch.init_adapters): routed logits and adapter gradients vs PyTorch."""

from __future__ import annotations

import argparse
import json
import sys

from dart_jax.parity.crosscheck import crosscheck_model


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description="dart_jax vs PyTorch transformers on the same inputs")
    ap.add_argument("--model", required=True, help="HF directory, .gguf file or embedded model name")
    ap.add_argument("--prompts", default=None, help="jsonl with 'messages' or 'prompt' per line")
    ap.add_argument("--max-new-tokens", type=int, default=32)
    ap.add_argument("--logit-tol", type=float, default=1e-3)
    ap.add_argument("--adapters", default=None, help="DART adapter directory: check routed logits and grads")
    ap.add_argument("--grad-tol", type=float, default=1e-4)
    ap.add_argument("--json", action="store_true", help="print the report as JSON")
    args = ap.parse_args(argv)
    if args.adapters:
        from dart_jax.parity.adapters_check import crosscheck_adapters
        rep = crosscheck_adapters(args.model, args.adapters)
        ok = rep.max_abs_logit_diff <= args.logit_tol and rep.max_abs_grad_diff <= args.grad_tol
        if args.json:
            print(json.dumps({**rep.to_dict(), "logit_tol": args.logit_tol, "grad_tol": args.grad_tol, "pass": ok}, indent=2))
        else:
            print(rep.text())
            print("PASS" if ok else "FAIL")
        return 0 if ok else 1
    report = crosscheck_model(args.model, args.prompts, args.max_new_tokens)
    ok = report.max_abs_logit_diff <= args.logit_tol and report.greedy_agree == report.greedy_tokens
    if args.json:
        print(json.dumps({**report.to_dict(), "logit_tol": args.logit_tol, "pass": ok}, indent=2))
    else:
        print(report.text())
        print("PASS" if ok else "FAIL")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
