"""python -m launch.crosscheck --model <hf dir | gguf file | smollm2-135m-instruct> [--prompts FILE] [--json]"""

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
    ap.add_argument("--json", action="store_true", help="print the report as JSON")
    args = ap.parse_args(argv)
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
