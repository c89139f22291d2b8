"""Wall-clock timing for benchmarks (never used in tests).

This host is shared and noisy (the same code measured 1.86× and 1.19× a day apart, the matmul peak
falling from ~400 to 190 GFLOP/s), so side-by-side benchmarks interleave their sides — A B A B … —
and report each ratio as the median of the per-round ratios with its range: a slow moment hits
both sides of a round, not one side's whole series.
"""

from __future__ import annotations

import statistics
import time
from typing import Callable


def time_fn(fn: Callable[[], object], warmup: int = 1, repeats: int = 3) -> dict:
    """Median / min seconds of `fn()` after `warmup` calls (the first includes compilation)."""
    return interleaved({"fn": fn}, warmup, repeats, settle_s=0.0, settle_calls=0)["fn"]


def interleaved(sides: dict[str, Callable[[], object]], warmup: int = 1, repeats: int = 5,
                settle_s: float = 0.5, settle_calls: int = 1) -> dict[str, dict]:
    """Time every side once per round, in turn, for `repeats` rounds after `warmup` calls of each.
    Before its timed call a side sleeps `settle_s` (the previous side's worker threads stop
    spinning) and runs `settle_calls` untimed calls: measured here, the first XLA:CPU update after a
    PyTorch update took 17.4 s and the next 11.4 s (after a sleep or numpy work, 10 s both), so
    without them every round would bill one framework for the other's leftovers.
    -> {side: {median_s, min_s, warmup_s, repeats, times_s}}."""
    out = {}
    for name, fn in sides.items():
        t0 = time.perf_counter()
        for _ in range(warmup):
            fn()
        out[name] = {"warmup_s": time.perf_counter() - t0, "times_s": []}
    for _ in range(repeats):
        for name, fn in sides.items():
            time.sleep(settle_s)
            for _ in range(settle_calls):
                fn()
            t = time.perf_counter()
            fn()
            out[name]["times_s"].append(time.perf_counter() - t)
    for r in out.values():
        r.update(median_s=statistics.median(r["times_s"]), min_s=min(r["times_s"]), repeats=repeats)
    return out


def ratio(results: dict[str, dict], slower: str, faster: str) -> dict:
    """Per-round time ratio slower / faster (> 1: `faster` is faster): median and [min, max]."""
    rs = [a / b for a, b in zip(results[slower]["times_s"], results[faster]["times_s"])]
    return {"median": statistics.median(rs), "min": min(rs), "max": max(rs), "rounds": len(rs)}


def fmt_ratio(r: dict) -> str:
    return f"{r['median']:.2f}× (range {r['min']:.2f}–{r['max']:.2f} over {r['rounds']} interleaved rounds)"


def matmul_probe(n: int = 2048) -> tuple[Callable[[], object], float]:
    """(a jitted n×n fp32 matmul, its FLOPs): a side to time in the same rounds, giving the peak a
    benchmark's FLOP rate is quoted against as measured alongside it."""
    import jax
    import jax.numpy as jnp
    a = jnp.ones((n, n), jnp.float32)
    f = jax.jit(lambda x: x @ x)
    return (lambda: f(a).block_until_ready()), 2.0 * n ** 3


def peak_per_round(results: dict[str, dict], flops: float, side: str = "matmul") -> list[float]:
    return [flops / t for t in results[side]["times_s"]]


class CompileClock:
    """Seconds JAX spent making programs while active — tracing, lowering and XLA compiling, from
    jax.monitoring's events — and how many programs it compiled or loaded from the persistent
    compilation cache (a load is counted, and timed, as a compile):

        with CompileClock() as clock:
            ...
        clock.seconds, clock.programs

    Benchmarks whose sides meet new shapes as they run (the serving engine's row buckets and widths)
    report their time with and without it: a long run makes each program once, a short benchmark mostly."""

    COMPILE = "/jax/core/compile/backend_compile_duration"
    EVENTS = (COMPILE, "/jax/core/compile/jaxpr_trace_duration", "/jax/core/compile/jaxpr_to_mlir_module_duration")

    def __init__(self):
        self.seconds, self.programs = 0.0, 0

    def _on(self, event: str, duration: float, **_):
        if event in self.EVENTS:
            self.seconds += duration
            self.programs += event == self.COMPILE

    def __enter__(self) -> "CompileClock":
        import jax
        jax.monitoring.register_event_duration_secs_listener(self._on)
        return self

    def __exit__(self, *exc):
        import jax
        jax.monitoring.unregister_event_duration_listener(self._on)
