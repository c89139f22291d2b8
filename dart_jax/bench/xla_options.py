"""The GRPO update of `launch.bench train` under XLA:CPU options and model settings, interleaved across
processes (XLA flags are read once per process):

    python -m launch.bench options --options=default,ynn_eltwise,dpa

One worker process per option loads the model, compiles the update and runs it twice; then the parent
asks each worker in turn for one timed update (round 1: A B C, round 2: A B C, ...), so a slow moment
of this shared host hits every option of a round. Each worker also reports the update's loss and
gradient norm per call: the same inputs and the same sequence of updates, so an option that keeps the
numerics gives the default's values (to fp32 reduction order), and one that does not shows by how much.

OPTIONS (name: XLA flags and/or settings of the update):
    default              the pinned jaxlib's defaults, remat none, hand-written GQA attention, log-prob chunk 128
    ynn_eltwise          YNNPACK fuses elementwise ops too (dots are YNN fusions by default)
    ynn_eltwise_reduce   ... and reductions (already YNN fusions by default in jaxlib 0.10.2)
    concurrent_sched     XLA:CPU's concurrency-optimised scheduler
    no_ynn_reduce        reductions as XLA's own loops, not YNNPACK fusions (dots stay YNN)
    no_ynn               no YNNPACK fusion at all (dots as XLA:CPU's own kernels)
    dpa                  jax.nn.dot_product_attention (implementation chosen by JAX) for the hand-written attention
    remat_dots           remat policy "dots" (save matmul outputs, recompute the rest)
    chunk_512 / chunk_32 log-probs over 512 / 32 positions at a time (default 128)
    lp_logits            the log-probs' backward from saved logits, no recomputed head matmul (rl/logprobs.py)
    lp_autodiff          the log-probs differentiated by JAX (rematerialised chunks) instead of by hand
    unrolled             the layers as a Python loop over a per-layer base (no scan, no stacked residuals)
    block_64 / block_256 causal query blocks of 64 / 256 positions (default 128)
    bf16                 bf16 compute, fp32 masters (numerics change)
"""

from __future__ import annotations

import json
import os
import select
import statistics
import subprocess
import sys
import time

OPTIONS = {
    "default": {},
    "ynn_eltwise": {"xla_flags": "--xla_cpu_experimental_ynn_fusion_type=+eltwise"},
    "ynn_eltwise_reduce": {"xla_flags": "--xla_cpu_experimental_ynn_fusion_type=+eltwise,+reduce"},
    "no_ynn_reduce": {"xla_flags": "--xla_cpu_experimental_ynn_fusion_type=-reduce"},
    "no_ynn": {"xla_flags": "--xla_cpu_experimental_ynn_fusion_type="},
    "concurrent_sched": {"xla_flags": "--xla_cpu_enable_concurrency_optimized_scheduler=true"},
    "dpa": {"overrides": {"attention_impl": "auto"}},
    "remat_dots": {"remat_policy": "dots"},
    "chunk_512": {"logprob_chunk": 512},
    "chunk_32": {"logprob_chunk": 32},
    "lp_logits": {"loss": {"logprob_residual": "logits"}},
    "lp_autodiff": {"loss": {"logprob_residual": "autodiff"}},
    "unrolled": {"unstack": True},
    "block_64": {"overrides": {"causal_block": 64}},
    "block_256": {"overrides": {"causal_block": 256}},
    "bf16": {"overrides": {"compute_dtype": "bfloat16"}},
}


READY_TIMEOUT_S = 1800  # a worker's load + compile + two updates (minutes on 2 cores at SmolLM2 4×512)
RUN_TIMEOUT_S = 900     # one update


def _worker(model: str, batch: int, length: int, option: str) -> None:
    """Run as `python -m dart_jax.bench.xla_options MODEL BATCH LENGTH OPTION`: set up, warm up, then one
    timed update per "run" line on stdin, one JSON line per update on stdout."""
    # the protocol owns the original stdout; everything else written to fd 1 (Python or C++) goes to stderr
    out = os.fdopen(os.dup(1), "w")
    os.dup2(2, 1)
    sys.stdout = sys.stderr
    from dart_jax.bench.train import setup_update
    o = OPTIONS[option]
    u = setup_update(model, batch, length, o.get("remat_policy", "none"), o.get("logprob_chunk"),
                     loss=o.get("loss"), unstack=o.get("unstack", False), **o.get("overrides", {}))
    t = time.perf_counter()
    for _ in range(2):
        u.ours()
    ready = {"ready": True, "warmup_s": time.perf_counter() - t, "xla_flags": os.environ.get("XLA_FLAGS", "")}
    print(json.dumps(ready), file=out, flush=True)
    for line in sys.stdin:
        if line.strip() != "run":
            break
        t = time.perf_counter()
        m = u.ours()
        dt = time.perf_counter() - t
        print(json.dumps({"s": dt, "loss": float(m["loss"]) if "loss" in m else None,
                          "grad_norm": float(m["grad_norm"])}), file=out, flush=True)


def _reply(p: subprocess.Popen, option: str, timeout_s: float, when: str) -> dict:
    """The worker's next JSON line, or a clear error when it exits or stays silent for `timeout_s`."""
    got, _, _ = select.select([p.stdout], [], [], timeout_s)
    line = p.stdout.readline() if got else None
    if line is None:
        p.kill()
        raise RuntimeError(f"option {option}: no reply from its worker in {timeout_s:.0f} s ({when}); killed")
    if not line:
        raise RuntimeError(f"option {option}: the worker exited ({p.wait()}) {when}; its error is above")
    return json.loads(line)


def check_options(options: tuple[str, ...]) -> None:
    """ValueError unless `options` starts with "default" and names only OPTIONS."""
    bad = [o for o in options if o not in OPTIONS]
    if bad or not options or options[0] != "default":
        raise ValueError(f"options {list(options)} must start with default (the ratios are against it) and name "
                         f"some of {list(OPTIONS)}{'; unknown ' + str(bad) if bad else ''}")


def bench_options(model: str = "smollm2-135m-instruct", batch: int = 4, length: int = 512, repeats: int = 3,
                  options: tuple[str, ...] = ("default", "ynn_eltwise", "dpa")) -> dict:
    check_options(options)
    procs, ready = {}, {}
    try:
        for o in options:  # one at a time: each compiles with the host to itself
            env = dict(os.environ)
            env["XLA_FLAGS"] = " ".join(x for x in (env.get("XLA_FLAGS", ""), OPTIONS[o].get("xla_flags", "")) if x)
            procs[o] = subprocess.Popen([sys.executable, "-m", "dart_jax.bench.xla_options", model, str(batch),
                                         str(length), o], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True,
                                        env=env)
            ready[o] = _reply(procs[o], o, READY_TIMEOUT_S, "before it was ready")
        rounds = {o: [] for o in options}
        for _ in range(repeats):
            for o in options:
                time.sleep(0.5)  # the previous worker's threads settle
                procs[o].stdin.write("run\n")
                procs[o].stdin.flush()
                rounds[o].append(_reply(procs[o], o, RUN_TIMEOUT_S, "mid-benchmark"))
    finally:
        for p in procs.values():
            if p.stdin and not p.stdin.closed:
                p.stdin.close()  # the worker's loop ends
            try:
                p.wait(timeout=60)
            except subprocess.TimeoutExpired:
                p.kill()
                p.wait()
    base = rounds["default"]
    out = {"bench": "options", "model": model, "batch": batch, "length": length, "repeats": repeats, "options": {}}
    for o in options:
        r = rounds[o]
        ratios = [b["s"] / x["s"] for b, x in zip(base, r)]
        dl = [abs(x["loss"] - b["loss"]) / max(abs(b["loss"]), 1e-30) for b, x in zip(base, r)
              if x["loss"] is not None and b["loss"] is not None]
        dg = [abs(x["grad_norm"] - b["grad_norm"]) / max(abs(b["grad_norm"]), 1e-30) for b, x in zip(base, r)]
        out["options"][o] = {"setting": OPTIONS[o], "times_s": [x["s"] for x in r],
                             "median_s": statistics.median(x["s"] for x in r), "warmup_s": ready[o]["warmup_s"],
                             "xla_flags": ready[o]["xla_flags"],
                             "speedup": {"median": statistics.median(ratios), "min": min(ratios), "max": max(ratios),
                                         "rounds": len(ratios)},
                             "loss_rel_diff": max(dl) if dl else None, "grad_norm_rel_diff": max(dg)}
    return out


if __name__ == "__main__":
    _worker(sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), sys.argv[4])
