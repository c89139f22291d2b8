"""python -m launch.init_adapters --model M --out DIR [--rank 8 --alpha 16 --seed 0 --b-std 0]

Writes a DART adapter directory (two PEFT adapters + tag tokens) for model M."""

from __future__ import annotations

import argparse
import sys

from dart_jax.adapters.bootstrap import init_dart_directory
from dart_jax.adapters.method import MethodSpec


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--model", required=True)
    ap.add_argument("--out", required=True)
    ap.add_argument("--rank", type=int, default=8)
    ap.add_argument("--alpha", type=float, default=16.0)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--b-std", type=float, default=0.0,
                    help="B ~ N(0, b_std^2) instead of 0 (for cross-checks)")
    ap.add_argument("--task", choices=["qa", "sql"], default="qa", help="router tags: <search> or <sql>")
    args = ap.parse_args(argv)
    tags = ("<search>", "</search>") if args.task == "qa" else ("<sql>", "</sql>")
    out = init_dart_directory(args.model, args.out, MethodSpec("dart", rank=args.rank, alpha=args.alpha),
                              args.seed, args.b_std, *tags)
    print(f"wrote DART adapters to {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
