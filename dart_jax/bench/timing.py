"""Wall-clock timing helpers for benchmarks (never used in tests)."""

from __future__ import annotations

import statistics
import time
from typing import Callable


def time_fn(fn: Callable[[], object], warmup: int = 1, repeats: int = 3) -> dict:
    """Median / min seconds of `fn()` after `warmup` calls (the first includes compilation)."""
    t0 = time.perf_counter()
    for _ in range(warmup):
        fn()
    first = time.perf_counter() - t0
    times = []
    for _ in range(repeats):
        t = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t)
    return {"median_s": statistics.median(times), "min_s": min(times), "warmup_s": first,
            "repeats": repeats}
