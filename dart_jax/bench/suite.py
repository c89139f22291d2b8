"""One command that measures an accelerator: `python -m launch.bench --json FILE suite`.

On whatever backend jax finds, on one device, with a random-init model of Qwen2.5-3B's shape in bf16
(`--shape=3b`; `small` keeps the family and scales it down for CPU, `tiny` is the CI smoke):

    peaks        a bf16 matmul (n × n) and a streaming copy, timed here: the peaks the figures below
                 are quoted against (measured in the same process, not the datasheet); the device's
                 nominal dense bf16 peak too where it is known (`NOMINAL_BF16_FLOPS`)
    train        one GRPO update (rl.step.make_train_step: policy loss, k3 KL, backward, clip, AdamW)
                 for DART (two rank-8 LoRAs, frozen base), LoRA-16 and full fine-tuning on the same
                 synthetic batch; model FLOPs = forward 2·P·tokens, backward 2·P·tokens more for
                 activation gradients and (full only) 2·P·tokens for weight gradients, attention
                 ×3 its forward (the LoRA factors' FLOPs are not counted); MFU against the measured
                 matmul peak and against the nominal peak
    decode       `batch` rows × `new_tokens` greedy tokens after a `prompt`-token prefill (the sampler's
                 prefill + one decode segment); tokens/s and the achieved memory bandwidth: per
                 decoded token the step reads every layer weight and the output head once, `batch`
                 rows of the embedding table, and the KV cache's written blocks the step attends over
                 (`cache_block`); the same segment reading the whole capacity is timed beside it
    attention    the DART update with `attention_impl="xla"` (causal query blocks) vs `"cudnn"`
                 (jax.nn.dot_product_attention with cuDNN, as training calls it: the dense
                 position mask, so its bias path rather than the causal-only kernel; reported as
                 unavailable where the backend has none)
    resume       a rollout with `turns` tool calls: KV-cache resume (our sampler) vs re-prefilling the
                 whole history before every turn (Search-R1 / SkyRL), interleaved rounds
    rollout_memory  the decode section's batch and prompt (≤ 32 new tokens) for each decode layout
                 (rollout.placement: stacked, per_layer, shared) on a fresh base: device memory while
                 decoding against weights + KV cache (bench.rollout_mesh; target ≤ 1.15 at 3B)

Every section records its own wall time and the compile time separately from the timed repeats; a
section (or one method) that fails records its error and the others still run, and the JSON is
rewritten after every section, so a run cut short keeps what it measured. The JSON's fields are
fixed (`FIELDS`) and checked by the CI smoke (tests/bench/test_suite.py). At `3b` the full
fine-tuning update holds ~43 GB of fp32 state + the bf16 base and its copy + remat'd activations of
2 × 2048 tokens: it is sized for one 80 GB+ device; smaller devices record an out-of-memory error for
that method.
"""

from __future__ import annotations

import dataclasses
import json
import platform
import time

import jax
import jax.numpy as jnp
import numpy as np

from dart_jax.adapters.method import MethodSpec, init_adapters, routes_for, trainable
from dart_jax.bench.rollout_mesh import sweep_rollout
from dart_jax.bench.sampler import _spec, decode_flops_per_token, resume_sides
from dart_jax.bench.shapes import model_config
from dart_jax.bench.timing import interleaved
from dart_jax.bench.train import synthetic_batch
from dart_jax.models import dots
from dart_jax.models.cache import init_cache
from dart_jax.models.config import ModelConfig
from dart_jax.models.transformer import clear_decode_layout, init_params, per_layer_params
from dart_jax.rl.optim import make_optimizer
from dart_jax.rl.step import BATCH_KEYS, init_state, make_train_step
from dart_jax.rollout.sampler import bucket, decode_segment, prefill
from dart_jax.run.spec import LossConfig, OptimConfig

# work per section: train (batch, length), decode (batch, prompt, new tokens), resume (batch, prompt, turns,
# tokens per turn, observation), matmul n, copy bytes, timed repeats
SIZES = {
    "3b": dict(train=(2, 2048), decode=(64, 128, 256), resume=(16, 512, 4, 64, 400), matmul=8192, copy=2 ** 30,
               repeats=3),
    "small": dict(train=(2, 256), decode=(8, 32, 32), resume=(4, 128, 2, 16, 64), matmul=1024, copy=2 ** 26,
                  repeats=2),
    "tiny": dict(train=(2, 32), decode=(2, 8, 8), resume=(2, 16, 2, 4, 8), matmul=128, copy=2 ** 20, repeats=1),
}
# dense bf16 peak FLOP/s from the vendors' datasheets (no sparsity), by jax's device_kind
NOMINAL_BF16_FLOPS = {"NVIDIA H200": 989e12, "NVIDIA H100 80GB HBM3": 989e12, "NVIDIA H100": 989e12,
                      "NVIDIA A100-SXM4-80GB": 312e12, "NVIDIA A100-SXM4-40GB": 312e12, "TPU v4": 275e12,
                      "TPU v5 lite": 197e12, "TPU v5e": 197e12, "TPU v5p": 459e12, "TPU v6 lite": 918e12}
METHODS = {"dart": dict(variant="dart", rank=8, alpha=16.0), "lora16": dict(variant="lora", rank=16, alpha=32.0),
           "full": dict(variant="full")}
FIELDS = {
    "": ("bench", "shape", "model", "backend", "device_kind", "devices", "jax", "jaxlib", "python", "peaks", "train",
         "decode", "attention", "resume", "rollout_memory", "wall_s"),
    "peaks": ("matmul_n", "matmul_dtype", "matmul_flops", "copy_bytes", "bandwidth_bytes_s", "nominal_bf16_flops"),
    "train": ("batch", "length", "remat_policy", "methods"),
    "train.method": ("trainable_params", "compile_s", "step_s", "tokens_per_s", "model_flops", "flops_per_s",
                     "mfu_measured", "mfu_nominal"),
    "decode": ("batch", "prompt", "new_tokens", "compile_s", "seconds", "tokens_per_s", "bytes_per_step",
               "bandwidth_bytes_s", "bandwidth_share", "flops_share", "cache_block", "capacity", "whole_capacity_s",
               "whole_over_blocks"),
    "attention": ("xla_s", "cudnn_s", "cudnn_over_xla", "cudnn_error"),
    "resume": ("batch", "prompt", "turns", "gen_per_turn", "obs_len", "resume_s", "reprefill_s", "speedup"),
    "rollout_memory": ("batch", "prompt", "new_tokens", "layouts"),
    "rollout_memory.layout": ("tokens_per_s", "weights_gib", "kv_gib", "temp_gib", "peak_gib", "ratio",
                              "device_peak_gib"),
}
LAYOUTS = ("stacked", "per_layer", "shared")


def update_model_flops(cfg: ModelConfig, batch: int, length: int, trains_base: bool) -> float:
    """Model FLOPs of one update (module doc): matmul parameters incl. the head; attention causal."""
    D, F, L, V = cfg.hidden_size, cfg.intermediate_size, cfg.num_layers, cfg.vocab_size
    N, K, H = cfg.num_heads, cfg.num_kv_heads, cfg.head_dim
    p_mm = L * (D * (N + 2 * K) * H + N * H * D + 3 * D * F) + D * V
    tokens = batch * length
    attn_fwd = 4 * L * length * length * N * H * batch / 2
    return (6 if trains_base else 4) * p_mm * tokens + 3 * attn_fwd


def _block(x):
    return jax.block_until_ready(x)


PEAK_ITERS = 8  # matmuls / copies per timed program: one dispatch's overhead is spread over them


def measure_peaks(n: int, copy_bytes: int, repeats: int, device_kind: str) -> dict:
    """Best of `repeats` programs of PEAK_ITERS dependent bf16 n×n matmuls (each feeds the next, so
    none is elided) and of PEAK_ITERS passes over a `copy_bytes` buffer (read + write each)."""
    a = jnp.asarray(np.random.default_rng(0).standard_normal((n, n)) / np.sqrt(n), jnp.bfloat16)
    # models.dots: the models' own bf16 product (on XLA:CPU accumulated in fp32: YNNPACK's bf16 kernels)
    mm = jax.jit(lambda x: jax.lax.fori_loop(0, PEAK_ITERS, lambda i, y: dots.dot(y, x), x))
    buf = jnp.zeros((copy_bytes // 4,), jnp.float32)
    cp = jax.jit(lambda x: jax.lax.fori_loop(0, PEAK_ITERS, lambda i, y: y * 0.5 + 1.0, x))
    res = interleaved({"matmul": lambda: _block(mm(a)), "copy": lambda: _block(cp(buf))}, repeats=max(3, repeats),
                      settle_s=0.0, settle_calls=0)
    return {"matmul_n": n, "matmul_dtype": "bfloat16",
            "matmul_flops": PEAK_ITERS * 2.0 * n ** 3 / res["matmul"]["min_s"],
            "copy_bytes": int(copy_bytes), "bandwidth_bytes_s": PEAK_ITERS * 2.0 * copy_bytes / res["copy"]["min_s"],
            "nominal_bf16_flops": NOMINAL_BF16_FLOPS.get(device_kind)}


def _train_side(cfg: ModelConfig, base, name: str, data: dict):
    """-> (run(), trainable params, compile seconds) of one method's jitted update."""
    spec = MethodSpec(**METHODS[name])
    ads = init_adapters(spec, cfg, jax.random.PRNGKey(0))
    oc = OptimConfig(lr=1e-6, warmup_steps=0, total_steps=10)
    params = trainable(spec, base, ads)
    if spec.trains_base:
        params = jax.tree.map(jnp.copy, params)  # the step donates the state; the frozen base stays
    state = init_state(params, make_optimizer(oc))
    mb = dict(data, route_ids=routes_for(spec, data["route_ids"]))
    step = jax.jit(make_train_step(cfg, spec, LossConfig(kl_coef=0.001), oc), donate_argnums=(0,))
    t0 = time.perf_counter()
    step = step.lower(state, base, mb, jax.random.PRNGKey(1), np.int32(0)).compile()
    compile_s = time.perf_counter() - t0
    holder = {"state": state}

    def run():
        holder["state"], m = step(holder["state"], base, mb, jax.random.PRNGKey(1), np.int32(0))
        _block(m["loss"])
    n = sum(int(np.prod(x.shape)) for x in jax.tree.leaves(params))
    return run, n, compile_s


def bench_train_methods(cfg, base, batch: int, length: int, repeats: int, peaks: dict,
                        keep: dict | None = None) -> dict:
    """`keep`: receives DART's compiled update (`keep["dart"]`), which the attention section times
    again as its XLA side instead of compiling it a second time."""
    data = {k: jnp.asarray(v)[None] for k, v in synthetic_batch(cfg, batch, length).items() if k in BATCH_KEYS}
    out = {"batch": batch, "length": length, "remat_policy": cfg.remat_policy, "methods": {}}
    for name in METHODS:
        try:
            run, n, compile_s = _train_side(cfg, base, name, data)
            res = interleaved({name: run}, repeats=repeats, settle_s=0.0, settle_calls=0)[name]
        except Exception as e:  # e.g. out of memory for full fine-tuning on a small device
            out["methods"][name] = {"error": _error(e)}
            continue
        flops = update_model_flops(cfg, batch, length, METHODS[name]["variant"] == "full")
        rate = flops / res["median_s"]
        nominal = peaks["nominal_bf16_flops"]
        out["methods"][name] = {"trainable_params": n, "compile_s": compile_s, "step_s": res["median_s"],
                                "tokens_per_s": batch * length / res["median_s"], "model_flops": flops,
                                "flops_per_s": rate, "mfu_measured": rate / peaks["matmul_flops"],
                                "mfu_nominal": rate / nominal if nominal else None}
        if keep is not None and name == "dart":
            keep[name] = run
        del run
    return out


def _error(e: BaseException) -> str:
    return f"{type(e).__name__}: {(str(e).splitlines() or [''])[0][:300]}"


def _tree_bytes(tree) -> int:
    return sum(x.size * x.dtype.itemsize for x in jax.tree.leaves(tree))


def bench_decode(cfg, layers, batch: int, prompt: int, new: int, repeats: int, peaks: dict) -> dict:
    """The decode segment as rollouts run it (attention over the cache's written blocks of
    `cfg.cache_block`), and the same segment reading the cache's whole capacity (cache_block 0),
    interleaved: what the block loop costs or saves on this backend."""
    toks = jnp.asarray(np.random.default_rng(1).integers(100, cfg.vocab_size, (batch, prompt)), jnp.int32)
    pos = jnp.broadcast_to(jnp.arange(prompt, dtype=jnp.int32), (batch, prompt))
    capacity = bucket(prompt + new + 1)
    ones, stop_on, budget = jnp.ones((batch,), bool), jnp.ones((batch, 1), bool), jnp.full((batch,), new, jnp.int32)

    def start(spec):
        state, _ = prefill(layers, None, toks, pos, init_cache(cfg, batch, capacity), jax.random.PRNGKey(0), spec=spec)
        return _block(state)

    def decode(state, spec):
        _, seg = decode_segment(layers, None, state, ones, stop_on, budget, spec=spec, length=new)
        return _block(seg.tokens)
    if not (0 < cfg.cache_block < capacity and capacity % cfg.cache_block == 0):  # small shapes: smaller blocks,
        cfg = cfg.replace(cache_block=capacity // 4)  # so the block loop runs (and the CPU smoke exercises it)
    specs = {"blocks": _spec(cfg), "whole": _spec(cfg.replace(cache_block=0))}
    t0 = time.perf_counter()
    decode(start(specs["blocks"]), specs["blocks"])
    compile_s = time.perf_counter() - t0
    decode(start(specs["whole"]), specs["whole"])
    times: dict = {k: [] for k in specs}
    for _ in range(repeats):
        for k, spec in specs.items():
            state = start(spec)  # prefill untimed: the decode segment alone
            t = time.perf_counter()
            decode(state, spec)
            times[k].append(time.perf_counter() - t)
    seconds = float(np.median(times["blocks"]))
    blk = cfg.cache_block
    read = np.mean([min(capacity, -(-(prompt + i + 1) // blk) * blk) for i in range(new)])  # slots a step reads
    kv = 2 * cfg.num_layers * batch * cfg.num_kv_heads * cfg.head_dim * read * cfg.dtype.itemsize
    # every weight once but the embedding table, of which a step gathers `batch` rows
    emb = layers["embed"]
    per_step = _tree_bytes(layers) - _tree_bytes(emb) + batch * emb.shape[1] * emb.dtype.itemsize + kv
    bw = per_step * new / seconds
    flops = batch * new * decode_flops_per_token(cfg, prompt + new // 2)
    return {"batch": batch, "prompt": prompt, "new_tokens": new, "compile_s": compile_s, "seconds": seconds,
            "tokens_per_s": batch * new / seconds, "bytes_per_step": int(per_step), "bandwidth_bytes_s": bw,
            "bandwidth_share": bw / peaks["bandwidth_bytes_s"], "flops_share": flops / seconds / peaks["matmul_flops"],
            "cache_block": cfg.cache_block, "capacity": capacity, "whole_capacity_s": float(np.median(times["whole"])),
            "whole_over_blocks": float(np.median([w / b for w, b in zip(times["whole"], times["blocks"])]))}


def bench_attention(cfg, base, batch: int, length: int, repeats: int, xla_run=None) -> dict:
    """The DART update with XLA attention vs cuDNN's fused kernel (same weights and batch); `xla_run`:
    the train section's compiled DART update (the same program), else compiled here."""
    data = {k: jnp.asarray(v)[None] for k, v in synthetic_batch(cfg, batch, length).items() if k in BATCH_KEYS}
    run_x = xla_run if xla_run is not None else _train_side(cfg, base, "dart", data)[0]
    sides, err = {"xla": run_x}, None
    try:
        run_c, _, _ = _train_side(dataclasses.replace(cfg, attention_impl="cudnn"), base, "dart", data)
        run_c()
        sides["cudnn"] = run_c
    except Exception as e:  # no cuDNN on this backend, or the kernel refuses the shape
        err = _error(e)
    res = interleaved(sides, repeats=repeats, settle_s=0.0, settle_calls=0)
    cud = res["cudnn"]["median_s"] if "cudnn" in res else None
    return {"xla_s": res["xla"]["median_s"], "cudnn_s": cud,
            "cudnn_over_xla": (res["xla"]["median_s"] / cud) if cud else None, "cudnn_error": err}


def bench_resume_random(cfg, layers, batch: int, prompt_len: int, turns: int, gen: int, obs_len: int,
                        repeats: int) -> dict:
    resume, reprefill = resume_sides(cfg, layers, batch, prompt_len, turns, gen, obs_len, seed=2)
    res = interleaved({"resume": resume, "reprefill": reprefill}, repeats=repeats, settle_s=0.0, settle_calls=0)
    return {"batch": batch, "prompt": prompt_len, "turns": turns, "gen_per_turn": gen, "obs_len": obs_len,
            "resume_s": res["resume"]["median_s"], "reprefill_s": res["reprefill"]["median_s"],
            "speedup": res["reprefill"]["median_s"] / res["resume"]["median_s"]}


def bench_rollout_memory(cfg, batch: int, prompt: int, new: int) -> dict:
    """Each decode layout on a fresh random base on one device (`bench.rollout_mesh`)."""
    rows = sweep_rollout(cfg, [(1, 1, 1)], batch, prompt, min(new, 32), layouts=LAYOUTS, log=lambda _: None)
    keep = FIELDS["rollout_memory.layout"]
    return {"batch": batch, "prompt": prompt, "new_tokens": min(new, 32),
            "layouts": {r["layout"]: ({"error": r["error"]} if "error" in r else {k: r[k] for k in keep})
                        for r in rows}}


def default_shape() -> str:
    return "small" if jax.default_backend() == "cpu" else "3b"


def run_suite(shape: str | None = None, remat_policy: str = "dots", repeats: int | None = None,
              log=print, json_path: str | None = None) -> dict:
    """Every section of the module doc on jax.devices()[0]; -> the JSON-ready result (`FIELDS`),
    also written to `json_path` after every section."""
    import jaxlib
    t_all = time.perf_counter()
    shape = shape or default_shape()
    size = SIZES[shape]
    repeats = repeats or size["repeats"]
    dev = jax.devices()[0]
    kind = getattr(dev, "device_kind", dev.platform)
    out = {"bench": "suite", "shape": shape, "model": f"qwen2.5-3b-shaped random init ({shape})",
           "backend": jax.default_backend(), "device_kind": kind, "devices": jax.device_count(),
           "jax": jax.__version__, "jaxlib": jaxlib.__version__, "python": platform.python_version(),
           "section_wall_s": {}}

    def section(name, fn):
        t0 = time.perf_counter()
        log(f"suite: {name} ...")
        try:
            out[name] = fn()
        except Exception as e:  # one section's failure (memory, a kernel) must not lose the others
            out[name] = {"error": _error(e)}
            log(f"suite: {name} failed: {out[name]['error']}")
        out["section_wall_s"][name] = time.perf_counter() - t0
        log(f"suite: {name} done in {out['section_wall_s'][name]:.1f} s")
        if json_path:
            with open(json_path, "w") as f:
                json.dump(dict(out, wall_s=time.perf_counter() - t_all), f, indent=2)

    cfg = model_config(shape, remat_policy=remat_policy)
    with jax.default_device(dev):
        section("peaks", lambda: measure_peaks(size["matmul"], size["copy"], repeats, kind))
        base = init_params(cfg, jax.random.PRNGKey(0))
        out["params"] = int(sum(x.size for x in jax.tree.leaves(base)))
        kept = {}
        section("train", lambda: bench_train_methods(cfg, base, *size["train"], repeats, out["peaks"], keep=kept))
        section("attention", lambda: bench_attention(cfg, base, *size["train"], repeats,
                                                     xla_run=kept.pop("dart", None)))
        layers = per_layer_params(base)
        section("decode", lambda: bench_decode(cfg, layers, *size["decode"], repeats, out["peaks"]))
        section("resume", lambda: bench_resume_random(cfg, layers, *size["resume"], repeats))
        # the memory section measures its own base and nothing else of ours: drop our references (rebound to
        # None rather than `del`eted, as the lambdas above close over these names)
        layers = base = None
        kept.clear()
        clear_decode_layout()
        section("rollout_memory", lambda: bench_rollout_memory(cfg, *size["decode"]))
    out["wall_s"] = time.perf_counter() - t_all
    if json_path:
        with open(json_path, "w") as f:
            json.dump(out, f, indent=2)
    return out


def missing_fields(res: dict) -> list[str]:
    """Fields of `FIELDS` absent from a suite result (the CI smoke's check)."""
    miss = [k for k in FIELDS[""] if k not in res]
    for sec in ("peaks", "train", "decode", "attention", "resume", "rollout_memory"):
        miss += [f"{sec}.{k}" for k in FIELDS[sec] if k not in res.get(sec, {})]
    for name in LAYOUTS:
        got = res.get("rollout_memory", {}).get("layouts", {}).get(name)
        if got is None:
            miss.append(f"rollout_memory.layouts.{name}")
        else:
            miss += [f"rollout_memory.layouts.{name}.{k}" for k in FIELDS["rollout_memory.layout"] if k not in got]
    for name in METHODS:
        got = res.get("train", {}).get("methods", {}).get(name)
        if got is None:
            miss.append(f"train.methods.{name}")
        else:
            miss += [f"train.methods.{name}.{k}" for k in FIELDS["train.method"] if k not in got]
    return miss
