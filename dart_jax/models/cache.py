"""KV cache: preallocated, GQA heads un-repeated, one write index shared by the batch.

Layout: k, v: [L, B, S, K, H]; pos: i32[B, S] holds the RoPE position of each filled slot and −1
for empty or padding slots. Attention masks keys by position (key valid iff 0 ≤ pos_k ≤ pos_q),
so left padding, per-row positions and padded appends (rows whose chunk is shorter are padded
with position −1) all work with one scalar write index. Slots marked −1 are never attended.
"""

from __future__ import annotations

from typing import TypedDict

import jax.numpy as jnp

from dart_jax.models.config import ModelConfig


class KVCache(TypedDict):
    k: jnp.ndarray      # [L, B, S, K, H]
    v: jnp.ndarray      # [L, B, S, K, H]
    pos: jnp.ndarray    # i32[B, S]
    index: jnp.ndarray  # i32[] next slot to write


def init_cache(cfg: ModelConfig, batch: int, max_len: int, dtype=None) -> KVCache:
    dtype = dtype or cfg.dtype
    shape = (cfg.num_layers, batch, max_len, cfg.num_kv_heads, cfg.head_dim)
    return KVCache(
        k=jnp.zeros(shape, dtype),
        v=jnp.zeros(shape, dtype),
        pos=jnp.full((batch, max_len), -1, jnp.int32),
        index=jnp.zeros((), jnp.int32),
    )
