"""Token sampling: temperature, top-k, top-p, greedy; the log-prob recorded for training.

The recorded log-prob is log softmax(logits / T)[token] over the *unfiltered* distribution (verl's
convention: the trainer recomputes exactly this quantity teacher-forced). T = 0 means greedy; its
log-prob is taken at T = 1.
"""

from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp


@dataclasses.dataclass(frozen=True)
class SamplingConfig:
    temperature: float = 1.0
    top_k: int = 0        # 0 = off
    top_p: float = 1.0    # 1 = off

    def __post_init__(self):
        if self.temperature < 0:
            raise ValueError(f"temperature must be ≥ 0, got {self.temperature}")
        if not 0 < self.top_p <= 1:
            raise ValueError(f"top_p must be in (0, 1], got {self.top_p}")
        if self.top_k < 0:
            raise ValueError(f"top_k must be ≥ 0, got {self.top_k}")

    @property
    def greedy(self) -> bool:
        return self.temperature == 0.0

    @property
    def logprob_temperature(self) -> float:
        return 1.0 if self.greedy else self.temperature


def filter_logits(z: jnp.ndarray, top_k: int, top_p: float) -> jnp.ndarray:
    """z: f32[B, V] (already divided by T) with everything outside top-k / the top-p nucleus set
    to −inf. The nucleus keeps the smallest prefix of sorted tokens whose mass reaches top_p."""
    neg = jnp.finfo(z.dtype).min
    if top_k:
        kth = jax.lax.top_k(z, top_k)[0][:, -1:]
        z = jnp.where(z < kth, neg, z)
    if top_p < 1.0:
        sorted_z = jnp.sort(z, axis=-1)[:, ::-1]
        probs = jax.nn.softmax(sorted_z, axis=-1)
        before = jnp.cumsum(probs, axis=-1) - probs          # mass strictly above each token
        keep_sorted = before < top_p
        cutoff = jnp.min(jnp.where(keep_sorted, sorted_z, jnp.inf), axis=-1, keepdims=True)
        z = jnp.where(z < cutoff, neg, z)
    return z


def sample(logits: jnp.ndarray, key: jax.Array, cfg: SamplingConfig) -> tuple[jnp.ndarray, jnp.ndarray]:
    """logits f32[B, V] -> (token i32[B], log-prob f32[B] at the sampling temperature)."""
    z = logits.astype(jnp.float32) / cfg.logprob_temperature
    if cfg.greedy:
        tok = jnp.argmax(z, axis=-1)
    else:
        tok = jax.random.categorical(key, filter_logits(z, cfg.top_k, cfg.top_p), axis=-1)
    lp = jnp.take_along_axis(jax.nn.log_softmax(z, axis=-1), tok[:, None], axis=-1)[:, 0]
    return tok.astype(jnp.int32), lp
