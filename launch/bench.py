"""dart_jax benchmarks, side by side with PyTorch in the same process.

    python -m launch.bench train                      one GRPO update of DART vs the same update in PyTorch
    python -m launch.bench forward --dtype=bfloat16   forward tokens/s vs transformers
    python -m launch.bench adapters                   fwd+bwd: DART vs one LoRA vs full, and PEFT in torch
    python -m launch.bench sampler --batches=1,8,32   decode tok/s vs transformers generate
    python -m launch.bench resume --obs-len=400       KV-cache resume vs re-prefilling the history per turn
    python -m launch.bench cache_blocks --length=768  decode attention over the cache's written blocks vs its capacity
    python -m launch.bench prefill --batch=2          a GRPO group's shared prompt prefill vs one per row (SQL schemas)
    python -m launch.bench group_update               a GRPO group's update with its prompt run once vs once per row, and PyTorch
    python -m launch.bench handoff --turns=4          two-model rollout: append-only hand-offs vs re-encoding the history
    python -m launch.bench methods                    training state and update time: DART, LoRA-16, full, MixLoRA, 2-Agent (full / LoRA)
    python -m launch.bench retrieval --clients=64     load on the retrieval service (or --url=another server)
    python -m launch.bench corpus --passages=1000000  passages by byte offset vs held as objects: memory per million
    python -m launch.bench --json=suite.json suite    an accelerator in one command: train MFU (DART, LoRA-16, full),
                                                      decode bandwidth, cuDNN vs XLA attention, resume vs re-prefill,
                                                      on a Qwen2.5-3B-shaped random model (--shape=3b|small|tiny;
                                                      default 3b on GPU / TPU, small on CPU)

Every side-by-side benchmark interleaves its sides (A B A B …, `--repeats` rounds after a warm-up,
each side settled by an untimed call) and prints each ratio as the median of the per-round ratios
with its range; FLOP-rate shares are against a 2048² fp32 matmul timed in the same rounds.
Unset size flags take the benchmark's own default (DEFAULTS below).
"""

from __future__ import annotations

import json
import os
import types

from absl import flags

from dart_jax.bench.timing import fmt_ratio
from launch._cli import Command

# PyTorch's OpenMP workers busy-wait after each parallel region; with the sides interleaved they would
# spin on the cores the next (JAX) side needs. Passive waiting must be set before torch loads.
os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")

BENCHES = ("forward", "adapters", "sampler", "resume", "cache_blocks", "train", "prefill", "group_update", "handoff",
           "retrieval", "methods", "suite", "corpus")
DEFAULTS = {"forward": dict(batch=8, length=512, repeats=5), "adapters": dict(batch=4, length=256, repeats=5),
            "sampler": dict(repeats=5), "resume": dict(batch=8, repeats=4),
            "cache_blocks": dict(batch=32, length=768, repeats=4), "train": dict(batch=4, length=512,
                                                                                          repeats=5),
            "prefill": dict(batch=2, repeats=3), "group_update": dict(batch=8, length=320, prompt_len=704, repeats=3),
            "handoff": dict(batch=1, repeats=3), "retrieval": dict(repeats=1),
            "methods": dict(batch=4, length=256, repeats=3), "suite": dict(repeats=None), "corpus": dict(repeats=1)}
CLI = Command("launch.bench", __doc__)
F = CLI.flags
MODEL = flags.DEFINE_string("model", "smollm2-135m-instruct", "model name or path", flag_values=F)
BATCH = flags.DEFINE_integer("batch", None, "rows (forward 8, adapters 4, resume 8, train 4)", flag_values=F)
LENGTH = flags.DEFINE_integer("length", None, "tokens per row (forward 512, adapters 256, train 512; cache_blocks: slots written, 768)", flag_values=F)
REPEATS = flags.DEFINE_integer("repeats", None, "interleaved rounds (5; resume 4)", flag_values=F)
DTYPE = flags.DEFINE_enum("dtype", "float32", ["float32", "bfloat16"], "forward / sampler: weights and compute "
                          "on both sides", flag_values=F)
NO_TORCH = flags.DEFINE_bool("no-torch", False, "adapters / sampler / train: our side only", flag_values=F)
BATCHES = flags.DEFINE_string("batches", "1,8,32", "sampler: batch sizes", flag_values=F)
NEW_TOKENS = flags.DEFINE_integer("new-tokens", 128, "sampler: tokens decoded per row", flag_values=F)
TEMPERATURE = flags.DEFINE_float("temperature", 0.0, "sampler: 0 = greedy; > 0 samples (both sides, no top-k / "
                                 "top-p)", flag_values=F)
TURNS = flags.DEFINE_integer("turns", 4, "resume / handoff: tool calls", flag_values=F)
OBS_LEN = flags.DEFINE_integer("obs-len", 400, "resume / handoff: observation tokens per call (3 passages ≈ 400)",
                               flag_values=F)
PROMPT_LEN = flags.DEFINE_integer("prompt-len", None, "resume / handoff: prompt tokens (256); group_update: the "
                                  "group's common prompt (704, an SQL schema prompt)", flag_values=F)
REMAT = flags.DEFINE_enum("remat", "none", ["none", "full", "dots", "dots_no_batch", "save_qkv_proj"],
                          "train: remat policy", flag_values=F)
CAPACITY = flags.DEFINE_integer("capacity", None, "cache_blocks: cache slots (default 2 × --length, the slots "
                                "written)", flag_values=F)
GROUP = flags.DEFINE_integer("group", 4, "prefill: samples per prompt (GRPO group size)", flag_values=F)
CLIENTS = flags.DEFINE_integer("clients", 64, "retrieval: concurrent clients", flag_values=F)
REQUESTS = flags.DEFINE_integer("requests", 20, "retrieval: requests per client", flag_values=F)
HOSTILE = flags.DEFINE_bool("hostile", True, "retrieval: slow-body, 1 MB and bad-length clients alongside",
                            flag_values=F)
URL = flags.DEFINE_string("url", None, "retrieval: load this server instead of starting ours", flag_values=F)
METHODS = flags.DEFINE_string("methods", None, "methods: comma-separated subset of dart, lora16, full, mixlora, "
                              "2agent, 2agent_lora (default: all)", flag_values=F)
SHAPE = flags.DEFINE_enum("shape", None, ["3b", "small", "tiny"], "suite: model shape (default: 3b on an "
                          "accelerator, small on CPU)", flag_values=F)
PASSAGES = flags.DEFINE_integer("passages", 1_000_000, "corpus: synthetic passages", flag_values=F)
JSON_OUT = flags.DEFINE_string("json", None, "also write the result to this file", flag_values=F)


def main(argv: list[str] | None = None) -> int:
    rest = CLI.parse(argv)
    if len(rest) != 1 or rest[0] not in BENCHES:
        raise SystemExit(f"launch.bench: name one benchmark of {BENCHES} (got {rest}); --help for examples")
    which = rest[0]
    d = DEFAULTS[which]
    args = types.SimpleNamespace(which=which, model=MODEL.value, batch=BATCH.value or d.get("batch"),
                                 length=LENGTH.value or d.get("length"), repeats=REPEATS.value or d["repeats"],
                                 dtype=DTYPE.value, no_torch=NO_TORCH.value, batches=BATCHES.value,
                                 new_tokens=NEW_TOKENS.value, temperature=TEMPERATURE.value, turns=TURNS.value,
                                 obs_len=OBS_LEN.value, prompt_len=PROMPT_LEN.value or d.get("prompt_len", 256),
                                 remat=REMAT.value,
                                 json=JSON_OUT.value)
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
    if args.which == "cache_blocks":
        from dart_jax.bench.sampler import bench_cache_blocks
        res = bench_cache_blocks(args.model, args.batch, args.length, CAPACITY.value or 2 * args.length,
                                 args.new_tokens, args.repeats, dtype=args.dtype)
        print(f"decode {res['new_tokens']} tokens, batch {res['batch']}, cache {res['filled']} of {res['capacity']} "
              f"slots ({res['dtype']}): written blocks of {res['block']} {res['blocks_s']:.2f} s, whole capacity "
              f"{res['whole_s']:.2f} s, whole / blocks {fmt_ratio(res['ratio'])}; same tokens: {res['same_tokens']}")
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
    if args.which == "prefill":
        from dart_jax.bench.sampler import bench_group_prefill
        res = bench_group_prefill(args.model, prompts=args.batch, group=GROUP.value, repeats=args.repeats)
        print(f"{res['prompts']} SQL schema prompts ({res['prompt_tokens']} tokens) x {res['group']} samples, prefill + "
              f"{res['gen']} decoded tokens: shared prefill {res['shared_s']:.2f} s, one per row {res['per_row_s']:.2f} s; "
              f"per row / shared {fmt_ratio(res['ratio'])}")
    if args.which == "group_update":
        from dart_jax.bench.group_update import bench_group_update
        res = bench_group_update(args.model, group=args.batch, prompt=args.prompt_len, cont=args.length,
                                 repeats=args.repeats, with_torch=not args.no_torch,
                                 remat_policy=args.remat if REMAT.present else "dots_no_batch")
        ms, fr = res["median_s"], res["flops_frac_of_matmul"]
        print(f"GRPO update of one group, {res['group']} rows x ({res['prompt']} prompt + {res['cont']} own tokens), "
              f"{res['model']} on {res['device']}, remat {res['remat_policy']}: prompt once {ms['shared']:.2f} s "
              f"({100 * fr['shared']:.0f}% of matmul), once per row {ms['per_row']:.2f} s ({100 * fr['per_row']:.0f}%); "
              f"per row / once {fmt_ratio(res['per_row_over_shared'])}; last losses "
              + ", ".join(f"{k} {v:.6f}" for k, v in res["last_loss"].items()))
        if "torch_over_shared" in res:
            print(f"  torch (concatenated 2r, full rows) {ms['torch_concat_2r']:.2f} s; torch / prompt once "
                  f"{fmt_ratio(res['torch_over_shared'])}")
    if args.which == "methods":
        from dart_jax.bench.methods import bench_methods, table
        from dart_jax.bench.methods import METHODS as ALL
        chosen = tuple(m.strip() for m in (METHODS.value or ",".join(ALL)).split(",") if m.strip())
        bad = set(chosen) - set(ALL)
        if bad:
            raise SystemExit(f"launch.bench methods: unknown --methods {sorted(bad)}; have {list(ALL)}")
        res = bench_methods(args.model, args.batch, args.length, args.repeats, methods=chosen,
                            dtype="bfloat16" if DTYPE.value == "bfloat16" or not DTYPE.present else DTYPE.value)
        print(table(res))
    if args.which == "handoff":
        from dart_jax.bench.sampler import bench_handoff
        res = bench_handoff(args.model, args.batch, args.prompt_len, args.turns, obs_len=args.obs_len,
                            repeats=args.repeats)
        print(f"two-model rollout, batch {res['batch']}, prompt {res['prompt_len']}, {res['turns']} tool calls "
              f"({res['reason_len']} reasoning + {res['span_len']} tool tokens, {res['obs_len']}-token observations): "
              f"append-only {res['append_s']:.2f} s, re-encode {res['reencode_s']:.2f} s, re-encode / append "
              f"{fmt_ratio(res['ratio'])}")
        print("time to the incoming model's first token per hand-off (ms): append-only "
              + " ".join(f"{1e3 * t:.0f}" for t in res["ttft_append_s"]) + "; re-encode "
              + " ".join(f"{1e3 * t:.0f}" for t in res["ttft_reencode_s"]))
    if args.which == "suite":
        from dart_jax.bench.suite import run_suite, table
        res = run_suite(SHAPE.value, remat_policy=args.remat if REMAT.present else "dots",
                        repeats=args.repeats, json_path=args.json)
        print(table(res))
    if args.which == "retrieval":
        from dart_jax.bench.retrieval_load import bench_retrieval
        res = bench_retrieval(URL.value, CLIENTS.value, REQUESTS.value, HOSTILE.value)
        print(f"retrieval {res['url']}: {res['clients']} clients x {res['requests_per_client']} requests, "
              f"{res['errors']} errors {res['errors_by_kind'] or ''}; latency p50 {res['p50_ms']:.0f} ms, "
              f"p95 {res['p95_ms']:.0f} ms, max {res['max_ms']:.0f} ms; {res['requests_per_s']:.0f} requests/s"
              + (f"; hostile clients: {res['hostile']}" if res["hostile"] else ""))
    if args.which == "corpus":
        from dart_jax.bench.corpus import bench_corpus
        res = bench_corpus(PASSAGES.value)
        print(f"{res['passages']:,} passages ({res['corpus_mib']:.0f} MiB), offset scan {res['scan_s']:.2f} s; per million "
              f"passages: by byte offset {res['by_offset_rss_mib_per_million']:.1f} MiB resident (anonymous "
              f"{res['by_offset_anon_mib_per_million']:.1f}; offset table {res['offsets_mib_per_million']:.1f} MiB), "
              f"{res['lookup_us']:.0f} us a passage; held as objects {res['as_objects_rss_mib_per_million']:.0f} MiB "
              f"({res['as_objects_load_s']:.1f} s to load)")
    if args.json:
        with open(args.json, "w") as fh:
            json.dump(res, fh, indent=2)
    return 0


if __name__ == "__main__":
    CLI.run(main)
