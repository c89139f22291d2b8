"""Binomial confidence intervals: the one Wilson score interval every report uses (held-out accuracy,
the method comparison, the lab's retrieval accuracy)."""

from __future__ import annotations

import math


def wilson_interval(k: int, n: int, z: float = 1.96) -> tuple[float, float]:
    """95% Wilson score interval of a binomial proportion k/n (nan, nan for n = 0)."""
    if n <= 0:
        return float("nan"), float("nan")
    p = k / n
    centre = (p + z * z / (2 * n)) / (1 + z * z / n)
    half = z * math.sqrt(p * (1 - p) / n + z * z / (4 * n * n)) / (1 + z * z / n)
    return max(0.0, centre - half), min(1.0, centre + half)


def two_way_resamples(x, n_boot: int = 10_000, seed: int = 0):
    """x f64[S, Q] (seeds × questions) -> f64[n_boot]: the mean of each resample that draws S seeds and Q
    questions with replacement (the same questions for every seed)."""
    import numpy as np
    S, Q = x.shape
    rng = np.random.default_rng(seed)
    return np.array([x[rng.integers(0, S, S)][:, rng.integers(0, Q, Q)].mean() for _ in range(n_boot)])
