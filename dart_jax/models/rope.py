"""Rotary position embeddings in the HF `rotate_half` layout, with Llama-3 frequency scaling."""

from __future__ import annotations

import math

import jax.numpy as jnp
import numpy as np

from dart_jax.models.config import ModelConfig


def inverse_frequencies(cfg: ModelConfig) -> np.ndarray:
    """inv_freq[i] = theta^(-2i/H), then (rope_type llama3) long wavelengths divided by `factor`
    with a smooth ramp between `low_freq_factor` and `high_freq_factor` (Llama 3.1 paper, §3.1).
    Computed in float32 exactly as transformers does, so logits agree to fp32 rounding."""
    h = cfg.head_dim
    inv = 1.0 / (np.float32(cfg.rope_theta) ** (np.arange(0, h, 2, dtype=np.int64).astype(np.float32) / h))
    inv = inv.astype(np.float32)
    rs = cfg.rope_scaling
    if rs.rope_type != "llama3":
        return inv
    old_ctx = rs.original_max_position_embeddings
    low_wavelen = old_ctx / rs.low_freq_factor
    high_wavelen = old_ctx / rs.high_freq_factor
    wavelen = (2 * math.pi / inv).astype(np.float32)
    scaled = np.where(wavelen > low_wavelen, inv / rs.factor, inv).astype(np.float32)
    smooth = (old_ctx / wavelen - rs.low_freq_factor) / (rs.high_freq_factor - rs.low_freq_factor)
    smoothed = (1 - smooth) * scaled / rs.factor + smooth * scaled
    medium = (wavelen >= high_wavelen) & (wavelen <= low_wavelen)
    return np.where(medium, smoothed, scaled).astype(np.float32)


def rope_tables(positions: jnp.ndarray, inv_freq: np.ndarray) -> tuple[jnp.ndarray, jnp.ndarray]:
    """positions: i32[B, T] (negative = padding, treated as 0) -> cos, sin: f32[B, T, H]."""
    pos = jnp.maximum(positions, 0).astype(jnp.float32)
    freqs = pos[..., None] * jnp.asarray(inv_freq)[None, None, :]
    emb = jnp.concatenate([freqs, freqs], axis=-1)
    return jnp.cos(emb), jnp.sin(emb)


def apply_rope(x: jnp.ndarray, cos: jnp.ndarray, sin: jnp.ndarray) -> jnp.ndarray:
    """x: [B, T, N, H]; cos/sin: f32[B, T, H]. Returns x·cos + rotate_half(x)·sin in x.dtype."""
    half = x.shape[-1] // 2
    rotated = jnp.concatenate([-x[..., half:], x[..., :half]], axis=-1)
    cos = cos[:, :, None, :].astype(x.dtype)
    sin = sin[:, :, None, :].astype(x.dtype)
    return x * cos + rotated * sin
