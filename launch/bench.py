"""python -m launch.bench forward [--batch 8 --length 512] [--json FILE]"""

from __future__ import annotations

import argparse
import json
import sys


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description="dart_jax benchmarks, side by side with PyTorch")
    sub = ap.add_subparsers(dest="which", required=True)
    f = sub.add_parser("forward", help="forward tokens/s vs transformers")
    f.add_argument("--model", default="smollm2-135m-instruct")
    f.add_argument("--batch", type=int, default=8)
    f.add_argument("--length", type=int, default=512)
    f.add_argument("--repeats", type=int, default=3)
    f.add_argument("--dtype", default="float32", choices=["float32", "bfloat16"])
    ap.add_argument("--json", default=None, help="also write the result to this file")
    args = ap.parse_args(argv)
    if args.which == "forward":
        from dart_jax.bench.forward import bench_forward
        res = bench_forward(args.model, args.batch, args.length, args.repeats, args.dtype)
        print(f"forward {res['model']} {res['batch']}x{res['length']} {res['dtype']} on {res['device']}: "
              f"dart_jax {res['ours_tokens_per_s']:.0f} tok/s, transformers "
              f"{res['transformers_tokens_per_s']:.0f} tok/s, ratio {res['speedup']:.2f}x")
    if args.json:
        with open(args.json, "w") as fh:
            json.dump(res, fh, indent=2)
    return 0


if __name__ == "__main__":
    sys.exit(main())
