"""python -m launch.bench [--json FILE] {forward,adapters,sampler,resume,train} [options]

Every side-by-side benchmark interleaves its sides (A B A B …, `--repeats` rounds after a warm-up)
and prints each ratio as the median of the per-round ratios with its range; FLOP-rate shares are
against a 2048² fp32 matmul timed in the same rounds."""

from __future__ import annotations

import argparse
import json
import os
import sys

# PyTorch's OpenMP workers busy-wait after each parallel region; with the sides interleaved they would
# spin on the cores the next (JAX) side needs. Passive waiting must be set before torch loads.
os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")

from dart_jax.bench.timing import fmt_ratio


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description="dart_jax benchmarks, side by side with PyTorch")
    sub = ap.add_subparsers(dest="which", required=True)
    f = sub.add_parser("forward", help="forward tokens/s vs transformers")
    f.add_argument("--model", default="smollm2-135m-instruct")
    f.add_argument("--batch", type=int, default=8)
    f.add_argument("--length", type=int, default=512)
    f.add_argument("--repeats", type=int, default=5)
    f.add_argument("--dtype", default="float32", choices=["float32", "bfloat16"])
    a = sub.add_parser("adapters", help="fwd+bwd: DART vs one LoRA vs full, and PEFT in torch")
    a.add_argument("--model", default="smollm2-135m-instruct")
    a.add_argument("--batch", type=int, default=4)
    a.add_argument("--length", type=int, default=256)
    a.add_argument("--repeats", type=int, default=5)
    a.add_argument("--no-torch", action="store_true")
    sp = sub.add_parser("sampler", help="decode tok/s vs transformers generate; FLOP/s vs matmul")
    sp.add_argument("--model", default="smollm2-135m-instruct")
    sp.add_argument("--batches", default="1,8,32")
    sp.add_argument("--new-tokens", type=int, default=128)
    sp.add_argument("--repeats", type=int, default=5)
    sp.add_argument("--no-torch", action="store_true")
    sp.add_argument("--dtype", default="float32", choices=["float32", "bfloat16"],
                    help="weights and compute on both sides")
    sp.add_argument("--temperature", type=float, default=0.0,
                    help="0 = greedy; > 0 samples (both sides, no top-k / top-p)")
    rs = sub.add_parser("resume", help="cache resume vs re-prefilling the history every turn")
    rs.add_argument("--model", default="smollm2-135m-instruct")
    rs.add_argument("--batch", type=int, default=8)
    rs.add_argument("--turns", type=int, default=4)
    rs.add_argument("--obs-len", type=int, default=400, help="observation tokens per call (3 passages ≈ 400)")
    rs.add_argument("--prompt-len", type=int, default=256)
    rs.add_argument("--repeats", type=int, default=4)
    tr = sub.add_parser("train", help="one GRPO update of DART vs the same update in PyTorch")
    tr.add_argument("--model", default="smollm2-135m-instruct")
    tr.add_argument("--batch", type=int, default=4)
    tr.add_argument("--length", type=int, default=512)
    tr.add_argument("--repeats", type=int, default=5)
    tr.add_argument("--no-torch", action="store_true")
    tr.add_argument("--remat", default="none", choices=["none", "full", "dots", "dots_no_batch", "save_qkv_proj"])
    ap.add_argument("--json", default=None, help="also write the result to this file")
    args = ap.parse_args(argv)
    if args.which == "forward":
        from dart_jax.bench.forward import bench_forward
        res = bench_forward(args.model, args.batch, args.length, args.repeats, args.dtype)
        print(f"forward {res['model']} {res['batch']}x{res['length']} {res['dtype']} on {res['device']}: "
              f"dart_jax {res['ours_tokens_per_s']:.0f} tok/s ({100 * res['ours_flops_frac_of_matmul']:.0f}% of "
              f"matmul {res['matmul_flops'] / 1e9:.0f} GFLOP/s), transformers {res['transformers_tokens_per_s']:.0f} "
              f"tok/s; transformers / dart_jax time {fmt_ratio(res['ratio'])}")
    if args.which == "adapters":
        from dart_jax.bench.adapters import bench_adapters
        res = bench_adapters(args.model, args.batch, args.length, args.repeats, not args.no_torch)
        ms = res["median_s"]
        print(f"fwd+bwd {res['model']} {res['batch']}x{res['length']} on {res['device']} (median s): "
              + ", ".join(f"{k} {v:.3f}" for k, v in ms.items()))
        print(f"DART / LoRA {fmt_ratio(res['dart_over_lora'])}\nfull / LoRA {fmt_ratio(res['full_over_lora'])}"
              + (f"\ntorch PEFT LoRA / ours LoRA {fmt_ratio(res['torch_peft_over_ours_lora'])}"
                 if "torch_peft_over_ours_lora" in res else ""))
    if args.which == "sampler":
        from dart_jax.bench.sampler import bench_sampler
        res = bench_sampler(args.model, tuple(int(x) for x in args.batches.split(",")), args.new_tokens,
                            repeats=args.repeats, with_torch=not args.no_torch, dtype=args.dtype,
                            temperature=args.temperature)
        print(f"matmul peak {res['matmul_flops'] / 1e9:.1f} GFLOP/s; {res['new_tokens']} new tokens, {res['dtype']}, "
              f"{'greedy' if not res['temperature'] else 'T = %g' % res['temperature']}")
        for r in res["rows"]:
            line = (f"batch {r['batch']:>3}: dart_jax {r['ours_tok_s']:8.1f} tok/s "
                    f"({100 * r['ours_flops_frac_of_matmul']:.1f}% of matmul FLOP/s)")
            if "hf_tok_s" in r:
                line += f", transformers generate {r['hf_tok_s']:8.1f} tok/s, time ratio {fmt_ratio(r['ratio'])}"
            print(line)
    if args.which == "resume":
        from dart_jax.bench.sampler import bench_resume
        res = bench_resume(args.model, args.batch, args.prompt_len, args.turns, obs_len=args.obs_len,
                           repeats=args.repeats)
        print(f"{res['turns']} tool calls, batch {res['batch']}, prompt {res['prompt_len']}, "
              f"{res['gen_per_turn']} generated + {res['obs_len']} observation tokens per turn: cache resume {res['resume_s']:.2f} s, "
              f"re-prefill {res['reprefill_s']:.2f} s, re-prefill / resume {fmt_ratio(res['ratio'])}")
    if args.which == "train":
        from dart_jax.bench.train import bench_train
        res = bench_train(args.model, args.batch, args.length, args.repeats, not args.no_torch, args.remat)
        ms = res["median_s"]
        print(f"GRPO update (DART 2x r8) {res['model']} {res['batch']}x{res['length']} on {res['device']}: "
              f"dart_jax {ms['dart_jax']:.2f} s ({100 * res['ours_flops_frac_of_matmul']:.1f}% of matmul "
              f"{res['matmul_flops'] / 1e9:.1f} GFLOP/s measured in the same rounds)")
        labels = {"concat_2r": "the authors' concatenated-2r module (same update)",
                  "peft_r16": "PEFT, one rank-16 adapter (floor: no routing)",
                  "hooks": "hook reference, both adapters on every token (≈2× LoRA work)"}
        for side, r in res["ratios"].items():
            print(f"  torch {labels[side]}: {ms['torch_' + side]:.2f} s; torch / dart_jax {fmt_ratio(r)}")
    if args.json:
        with open(args.json, "w") as fh:
            json.dump(res, fh, indent=2)
    return 0


if __name__ == "__main__":
    sys.exit(main())
