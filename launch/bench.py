"""python -m launch.bench [--json FILE] {forward,adapters} [options]"""

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
    a = sub.add_parser("adapters", help="fwd+bwd: DART vs one LoRA vs full, and PEFT in torch")
    a.add_argument("--model", default="smollm2-135m-instruct")
    a.add_argument("--batch", type=int, default=4)
    a.add_argument("--length", type=int, default=256)
    a.add_argument("--repeats", type=int, default=3)
    a.add_argument("--no-torch", action="store_true")
    ap.add_argument("--json", default=None, help="also write the result to this file")
    args = ap.parse_args(argv)
    if args.which == "forward":
        from dart_jax.bench.forward import bench_forward
        res = bench_forward(args.model, args.batch, args.length, args.repeats, args.dtype)
        print(f"forward {res['model']} {res['batch']}x{res['length']} {res['dtype']} on {res['device']}: "
              f"dart_jax {res['ours_tokens_per_s']:.0f} tok/s, transformers "
              f"{res['transformers_tokens_per_s']:.0f} tok/s, ratio {res['speedup']:.2f}x")
    if args.which == "adapters":
        from dart_jax.bench.adapters import bench_adapters
        res = bench_adapters(args.model, args.batch, args.length, args.repeats, not args.no_torch)
        ms = res["median_s"]
        print(f"fwd+bwd {res['model']} {res['batch']}x{res['length']} on {res['device']} (median s): "
              + ", ".join(f"{k} {v:.3f}" for k, v in ms.items()))
        print(f"DART / LoRA = {res['dart_over_lora']:.3f}x, full / LoRA = {res['full_over_lora']:.3f}x"
              + (f", torch PEFT LoRA / ours LoRA = {res['torch_peft_over_ours_lora']:.2f}x"
                 if "torch_peft_over_ours_lora" in res else ""))
    if args.json:
        with open(args.json, "w") as fh:
            json.dump(res, fh, indent=2)
    return 0


if __name__ == "__main__":
    sys.exit(main())
