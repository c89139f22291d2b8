"""dart_jax benchmarks, side by side with PyTorch in the same process.

    python -m launch.bench train                      one GRPO update of DART vs the same update in PyTorch
    python -m launch.bench profile                    that update's time per op class: XLA:CPU's HLO vs torch's aten ops
    python -m launch.bench profile_decode             the sampler's decode (batch 32) per op class, vs transformers generate
    python -m launch.bench options --options=default,ynn_eltwise,dpa   that update under XLA options / settings,
                                                      one process each, interleaved (bench/xla_options.py)
    python -m launch.bench forward --dtype=bfloat16   forward tokens/s vs transformers
    python -m launch.bench adapters                   fwd+bwd: DART vs one LoRA vs full, and PEFT in torch
    python -m launch.bench sampler --batches=1,8,32   decode tok/s vs transformers generate
    python -m launch.bench matmul                     the model's matmul shapes, fp32 / bf16, XLA:CPU vs torch
    python -m launch.bench resume --obs-len=400       KV-cache resume vs re-prefilling the history per turn
    python -m launch.bench cache_blocks --length=768  decode attention over the cache's written blocks vs its capacity
    python -m launch.bench prefill --batch=2          a GRPO group's shared prompt prefill vs one per row (SQL schemas)
    python -m launch.bench group_update               a GRPO group's update with its prompt run once vs once per row, and PyTorch
    python -m launch.bench handoff --turns=4          two-model rollout: append-only hand-offs vs re-encoding the history
    python -m launch.bench methods                    training state and update time: DART, LoRA-16, full, MixLoRA, 2-Agent (full / LoRA)
    python -m launch.bench retrieval --clients=64     load on the retrieval service (or --url=another server)
    python -m launch.bench corpus --passages=1000000  passages by byte offset vs held as objects: memory per million
    python -m launch.bench serve --clients=1,8,32,64  the chat server under load vs one at a time vs fixed batches
    python -m launch.bench rollouts --questions=16    the lab's rollouts: fixed batches (whole, running rows gathered) vs the engine
    python -m launch.bench grpo_rollouts              GRPO steps' rollouts (--rollout-config's batch) on the engine vs batch
    python -m launch.bench --json=suite.json suite    an accelerator in one command: train MFU (DART, LoRA-16, full),
                                                      decode bandwidth, cuDNN vs XLA attention, resume vs re-prefill,
                                                      on a Qwen2.5-3B-shaped random model (--shape=3b|small|tiny;
                                                      default 3b on GPU / TPU, small on CPU)

Every side-by-side benchmark interleaves its sides (A B A B …, `--repeats` rounds after a warm-up,
each side settled by an untimed call) and prints each ratio as the median of the per-round ratios
with its range; FLOP-rate shares are against a 2048² fp32 matmul timed in the same rounds.
Unset size flags take the benchmark's own default (DEFAULTS below).
"""  # noqa: E501 (--help text: the usage table's rows, printed as written)

from __future__ import annotations

import json
import os
import types

from absl import flags

from dart_jax.bench import report
from launch._cli import Command

# PyTorch's OpenMP workers busy-wait after each parallel region; with the sides interleaved they would
# spin on the cores the next (JAX) side needs. Passive waiting must be set before torch loads.
os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")

BENCHES = ("forward", "adapters", "sampler", "resume", "cache_blocks", "train", "prefill", "group_update", "handoff",
           "retrieval", "methods", "suite", "corpus", "serve", "rollouts", "grpo_rollouts", "profile", "options",
           "matmul", "profile_decode")
DEFAULTS = {"forward": dict(batch=8, length=512, repeats=5), "adapters": dict(batch=4, length=256, repeats=5),
            "sampler": dict(repeats=5), "resume": dict(batch=8, repeats=4),
            "cache_blocks": dict(batch=32, length=768, repeats=4), "train": dict(batch=4, length=512,
                                                                                          repeats=5),
            "prefill": dict(batch=2, repeats=3), "group_update": dict(batch=8, length=320, prompt_len=704, repeats=3),
            "handoff": dict(batch=1, repeats=3), "retrieval": dict(repeats=1),
            "methods": dict(batch=4, length=256, repeats=3), "suite": dict(repeats=None), "corpus": dict(repeats=1),
            "serve": dict(repeats=1), "rollouts": dict(batch=8, repeats=2), "grpo_rollouts": dict(repeats=3),
            "profile": dict(batch=4, length=512, repeats=2), "options": dict(batch=4, length=512, repeats=3),
            "matmul": dict(repeats=5), "profile_decode": dict(batch=32, repeats=1, prompt_len=32)}
CLI = Command("launch.bench", __doc__)
F = CLI.flags
MODEL = flags.DEFINE_string("model", "smollm2-135m-instruct", "model name or path", flag_values=F)
BATCH = flags.DEFINE_integer("batch", None, "rows (forward 8, adapters 4, resume 8, train 4, profile_decode 32; "
                             "rollouts: the batch and the engine's rows, 8)", flag_values=F)
LENGTH = flags.DEFINE_integer("length", None, "tokens per row (forward 512, adapters 256, train 512; "
                              "cache_blocks: slots written, 768)", flag_values=F)
REPEATS = flags.DEFINE_integer("repeats", None, "interleaved rounds (5; resume 4; options 3; profile: profiled "
                               "runs a side, 2; profile_decode: 1)", flag_values=F)
DTYPE = flags.DEFINE_enum("dtype", "float32", ["float32", "bfloat16"], "forward / sampler / profile_decode: "
                          "weights and compute on both sides", flag_values=F)
NO_TORCH = flags.DEFINE_bool("no-torch", False, "adapters / sampler / train / profile / "
                               "profile_decode: our side only", flag_values=F)
BATCHES = flags.DEFINE_string("batches", "1,8,32", "sampler: batch sizes", flag_values=F)
NEW_TOKENS = flags.DEFINE_integer("new-tokens", 128, "sampler / profile_decode: tokens decoded per row", flag_values=F)
TEMPERATURE = flags.DEFINE_float("temperature", 0.0, "sampler: 0 = greedy; > 0 samples (both sides, no top-k / "
                                 "top-p)", flag_values=F)
TURNS = flags.DEFINE_integer("turns", 4, "resume / handoff: tool calls", flag_values=F)
OBS_LEN = flags.DEFINE_integer("obs-len", 400, "resume / handoff: observation tokens per call (3 passages ≈ 400)",
                               flag_values=F)
PROMPT_LEN = flags.DEFINE_integer("prompt-len", None, "resume / handoff: prompt tokens (256; profile_decode 32); "
                                  "group_update: the group's common prompt (704, an SQL schema prompt)", flag_values=F)
REMAT = flags.DEFINE_enum("remat", "none", ["none", "full", "dots", "dots_no_batch", "save_qkv_proj"],
                          "train: remat policy", flag_values=F)
CAPACITY = flags.DEFINE_integer("capacity", None, "cache_blocks: cache slots (default 2 × --length, the slots "
                                "written)", flag_values=F)
GROUP = flags.DEFINE_integer("group", 4, "prefill: samples per prompt (GRPO group size)", flag_values=F)
CLIENTS = flags.DEFINE_string("clients", None, "retrieval: concurrent clients (64); serve: client counts "
                              "(1,8,32,64)", flag_values=F)
REQUESTS = flags.DEFINE_integer("requests", None, "retrieval: requests per client (20); serve: (2)", flag_values=F)
HOSTILE = flags.DEFINE_bool("hostile", True, "retrieval: slow-body, 1 MB and bad-length clients alongside",
                            flag_values=F)
MAX_SLOTS = flags.DEFINE_integer("max-slots", 0, "serve: the server's rows (0: one per client); more clients wait "
                                 "in its queue", flag_values=F)
URL = flags.DEFINE_string("url", None, "retrieval: load this server instead of starting ours", flag_values=F)
METHODS = flags.DEFINE_string("methods", None, "methods: comma-separated subset of dart, lora16, full, mixlora, "
                              "2agent, 2agent_lora (default: all)", flag_values=F)
SHAPE = flags.DEFINE_enum("shape", None, ["3b", "small", "tiny"], "suite: model shape (default: 3b on an "
                          "accelerator, small on CPU)", flag_values=F)
PASSAGES = flags.DEFINE_integer("passages", 1_000_000, "corpus: synthetic passages", flag_values=F)
ROLLOUT_CONFIG = flags.DEFINE_string("rollout-config", "configs/lab_quickstart.py", "rollouts: the run config "
                                     "whose policy, rollout settings and held-out questions are used; "
                                     "grpo_rollouts: whose policy, training questions and GRPO batch",
                                     flag_values=F)
QUESTIONS = flags.DEFINE_integer("questions", 16, "rollouts: held-out questions rolled out per side and round",
                                 flag_values=F)
XLA_OPTIONS = flags.DEFINE_string("options", None, "options: comma-separated, starting with default (default: "
                                  "default,ynn_eltwise,dpa; the choices: bench/xla_options.py's OPTIONS)",
                                  flag_values=F)
JSON_OUT = flags.DEFINE_string("json", None, "also write the result to this file", flag_values=F)


def main(argv: list[str] | None = None) -> int:
    rest = CLI.parse(argv)
    if len(rest) != 1 or rest[0] not in BENCHES:
        raise SystemExit(f"launch.bench: name one benchmark of {BENCHES} (got {rest}); --help for examples")
    which = rest[0]
    d = DEFAULTS[which]
    bad = [f"--{f.name}={f.value}" for f in (BATCH, LENGTH, REPEATS, PROMPT_LEN, CAPACITY, REQUESTS, NEW_TOKENS, TURNS,
                                              GROUP) if f.value is not None and f.value < 1]
    if bad:  # 0 once meant "the default" silently
        raise SystemExit(f"launch.bench: {', '.join(bad)} must be ≥ 1 (leave a flag out for the benchmark's default)")
    args = types.SimpleNamespace(which=which, model=MODEL.value, batch=BATCH.value or d.get("batch"),
                                 length=LENGTH.value or d.get("length"), repeats=REPEATS.value or d["repeats"],
                                 dtype=DTYPE.value, no_torch=NO_TORCH.value, batches=BATCHES.value,
                                 new_tokens=NEW_TOKENS.value, temperature=TEMPERATURE.value, turns=TURNS.value,
                                 obs_len=OBS_LEN.value, prompt_len=PROMPT_LEN.value or d.get("prompt_len", 256),
                                 remat=REMAT.value,
                                 json=JSON_OUT.value)
    res = run(args)
    print(report.text(which, res))
    if args.json:
        with open(args.json, "w") as fh:
            json.dump(res, fh, indent=2)
    return 0


def run(args) -> dict:
    """Run benchmark `args.which` -> its result."""
    which = args.which
    if which == "forward":
        from dart_jax.bench.forward import bench_forward
        return bench_forward(args.model, args.batch, args.length, args.repeats, args.dtype)
    if which == "adapters":
        from dart_jax.bench.adapters import bench_adapters
        return bench_adapters(args.model, args.batch, args.length, args.repeats, not args.no_torch)
    if which == "sampler":
        from dart_jax.bench.sampler import bench_sampler
        return bench_sampler(args.model, tuple(int(x) for x in args.batches.split(",")), args.new_tokens,
                             repeats=args.repeats, with_torch=not args.no_torch, dtype=args.dtype,
                             temperature=args.temperature)
    if which == "matmul":
        from dart_jax.bench.matmul import bench_matmul
        return bench_matmul(args.model, repeats=args.repeats, with_torch=not args.no_torch)
    if which == "resume":
        from dart_jax.bench.sampler import bench_resume
        return bench_resume(args.model, args.batch, args.prompt_len, args.turns, obs_len=args.obs_len,
                            repeats=args.repeats)
    if which == "cache_blocks":
        from dart_jax.bench.sampler import bench_cache_blocks
        return bench_cache_blocks(args.model, args.batch, args.length, CAPACITY.value or 2 * args.length,
                                  args.new_tokens, args.repeats, dtype=args.dtype)
    if which == "train":
        from dart_jax.bench.train import bench_train
        return bench_train(args.model, args.batch, args.length, args.repeats, not args.no_torch, args.remat)
    if which == "profile":
        from dart_jax.bench.profile import bench_profile
        return bench_profile(args.model, args.batch, args.length, args.repeats, args.remat, not args.no_torch)
    if which == "profile_decode":
        from dart_jax.bench.profile_decode import bench_profile_decode
        return bench_profile_decode(args.model, args.batch, args.new_tokens, args.prompt_len, args.repeats,
                                    args.dtype, not args.no_torch)
    if which == "options":
        from dart_jax.bench.xla_options import bench_options, check_options
        chosen = tuple(o.strip() for o in (XLA_OPTIONS.value or "default,ynn_eltwise,dpa").split(",") if o.strip())
        try:  # before any worker starts: nothing runs or is written on a mistake
            check_options(chosen)
        except ValueError as e:
            raise SystemExit(f"options: --options: {e}") from None
        return bench_options(args.model, args.batch, args.length, args.repeats, chosen)
    if which == "prefill":
        from dart_jax.bench.sampler import bench_group_prefill
        return bench_group_prefill(args.model, prompts=args.batch, group=GROUP.value, repeats=args.repeats)
    if which == "group_update":
        from dart_jax.bench.group_update import bench_group_update
        return bench_group_update(args.model, group=args.batch, prompt=args.prompt_len, cont=args.length,
                                  repeats=args.repeats, with_torch=not args.no_torch,
                                  remat_policy=args.remat if REMAT.present else "dots_no_batch")
    if which == "methods":
        from dart_jax.bench.methods import METHODS as ALL, bench_methods
        chosen = tuple(m.strip() for m in (METHODS.value or ",".join(ALL)).split(",") if m.strip())
        bad = set(chosen) - set(ALL)
        if bad:
            raise SystemExit(f"launch.bench methods: unknown --methods {sorted(bad)}; have {list(ALL)}")
        return bench_methods(args.model, args.batch, args.length, args.repeats, methods=chosen,
                             dtype="bfloat16" if DTYPE.value == "bfloat16" or not DTYPE.present else DTYPE.value)
    if which == "handoff":
        from dart_jax.bench.sampler import bench_handoff
        return bench_handoff(args.model, args.batch, args.prompt_len, args.turns, obs_len=args.obs_len,
                             repeats=args.repeats)
    if which == "suite":
        from dart_jax.bench.suite import run_suite
        return run_suite(SHAPE.value, remat_policy=args.remat if REMAT.present else "dots", repeats=args.repeats,
                         json_path=args.json)
    if which == "retrieval":
        from dart_jax.bench.retrieval_load import bench_retrieval
        return bench_retrieval(URL.value, int(CLIENTS.value or 64), REQUESTS.value or 20, HOSTILE.value)
    if which == "serve":
        if MAX_SLOTS.value < 0:
            raise SystemExit(f"serve: --max-slots={MAX_SLOTS.value} must be ≥ 0 (0: one slot per client)")
        from dart_jax.bench.serve_load import bench_serve
        return bench_serve(args.model, tuple(int(x) for x in (CLIENTS.value or "1,8,32,64").split(",")),
                           REQUESTS.value or 2, max_slots=MAX_SLOTS.value)
    if which == "rollouts":
        if QUESTIONS.value < 1 or args.batch < 1 or args.repeats < 1:
            raise SystemExit(f"rollouts: --questions={QUESTIONS.value}, --batch={args.batch} and "
                             f"--repeats={args.repeats} must each be ≥ 1")
        from dart_jax.bench.engine_rollouts import bench_rollouts
        from launch._cli import load_config_file
        return bench_rollouts(load_config_file(ROLLOUT_CONFIG.value), QUESTIONS.value, args.batch, args.repeats)
    if which == "grpo_rollouts":
        if args.repeats < 1:
            raise SystemExit(f"grpo_rollouts: --repeats={args.repeats} must be ≥ 1")
        from dart_jax.bench.engine_rollouts import bench_grpo_rollouts
        from launch._cli import load_config_file
        return bench_grpo_rollouts(load_config_file(ROLLOUT_CONFIG.value), args.repeats)
    from dart_jax.bench.corpus import bench_corpus
    return bench_corpus(PASSAGES.value)


if __name__ == "__main__":
    CLI.run(main)
