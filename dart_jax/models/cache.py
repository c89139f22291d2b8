"""KV cache: preallocated, one buffer per layer, GQA heads un-repeated, one write index shared by
the batch — or one per row (`per_row`), for an engine whose rows start and end at different times
(serve.engine): each row writes its chunk at its own index and advances it by the chunk's slots up
to its last valid position (right-padded chunks use no slot for their padding).

Layout: k[l]: [B, K, H, S] (keys stored transposed, the slot axis minor), v[l]: [B, K, S, H];
pos: i32[B, S] holds the RoPE position of each filled slot and −1 for empty or padding slots.
Attention masks keys by position (key valid iff 0 ≤ pos_k ≤ pos_q), so left padding, per-row
positions and padded appends (rows whose chunk is shorter are padded with position −1) all work
with one scalar write index. Slots marked −1 are never attended.

Why this layout (measured on XLA:CPU, SmolLM2 decode at batch 32): cached forwards run the layers
as an unrolled loop over per-layer buffers, so each read and each in-place write touches a whole
buffer — slicing a stacked [L, …] cache (or weight) inside the loop copies it every step. With the
slot axis minor, the decode score q·kᵀ is a plain batched matmul over the key buffer: storing keys
as [B, S, K, H] made XLA transpose every layer's keys at every step (17 ms of a 78 ms step at 161
slots), and the score einsum is 2.5–6× faster on the transposed buffer at 512–1,536 slots.
"""

from __future__ import annotations

from typing import TypedDict

import jax
import jax.numpy as jnp

from dart_jax.models.config import ModelConfig


class KVCache(TypedDict):
    k: tuple[jnp.ndarray, ...]  # per layer [B, K, H, S]
    v: tuple[jnp.ndarray, ...]  # per layer [B, K, S, H]
    pos: jnp.ndarray            # i32[B, S]
    index: jnp.ndarray          # i32[] next slot to write (i32[B]: per row)


def init_cache(cfg: ModelConfig, batch: int, max_len: int, dtype=None, per_row: bool = False) -> KVCache:
    dtype = dtype or cfg.dtype
    k, h = cfg.num_kv_heads, cfg.head_dim
    return KVCache(
        k=tuple(jnp.zeros((batch, k, h, max_len), dtype) for _ in range(cfg.num_layers)),
        v=tuple(jnp.zeros((batch, k, max_len, h), dtype) for _ in range(cfg.num_layers)),
        pos=jnp.full((batch, max_len), -1, jnp.int32),
        index=jnp.zeros((batch,) if per_row else (), jnp.int32),
    )


def filled(index: jnp.ndarray, chunk: int) -> jnp.ndarray:
    """Slots any row may hold after writing a chunk of `chunk` slots at `index` (scalar or per row)."""
    return jnp.max(index) + chunk


def write_pos(pos: jnp.ndarray, positions: jnp.ndarray, index: jnp.ndarray) -> jnp.ndarray:
    """pos i32[B, S] with a chunk's positions i32[B, T] written at `index` (scalar or per row)."""
    positions = positions.astype(jnp.int32)
    if index.ndim == 0:
        return jax.lax.dynamic_update_slice_in_dim(pos, positions, index, axis=1)
    return jax.vmap(lambda p, x, i: jax.lax.dynamic_update_slice(p, x, (i,)))(pos, positions, index)


def advance(index: jnp.ndarray, positions: jnp.ndarray) -> jnp.ndarray:
    """The write index after a chunk: + T (shared), or per row + the slots up to its last valid
    position (a right-padded chunk's padding is left free, a row with nothing valid stays put)."""
    t = positions.shape[1]
    if index.ndim == 0:
        return index + t
    used = jnp.max(jnp.where(positions >= 0, jnp.arange(1, t + 1, dtype=jnp.int32)[None], 0), axis=1)
    return index + used


def capacity(cache: KVCache) -> int:
    return int(cache["pos"].shape[1])


def grow(cache: KVCache, slots: int) -> KVCache:
    """The cache padded to `slots` slots (new slots empty: position −1)."""
    extra = slots - capacity(cache)
    if extra < 0:
        raise ValueError(f"cannot shrink a KV cache of {capacity(cache)} slots to {slots}")
    return KVCache(k=tuple(jnp.pad(a, ((0, 0), (0, 0), (0, 0), (0, extra))) for a in cache["k"]),
                   v=tuple(jnp.pad(a, ((0, 0), (0, 0), (0, extra), (0, 0))) for a in cache["v"]),
                   pos=jnp.pad(cache["pos"], ((0, 0), (0, extra)), constant_values=-1), index=cache["index"])


def _bits(dtype) -> jnp.dtype | None:
    """The same-width unsigned integer type a key buffer of 16-bit floats is updated through on XLA:CPU,
    else None.

    XLA:CPU has no bf16 / fp16 arithmetic: its float normalisation widens such elementwise ops to fp32,
    and a buffer update with the keys' RoPE fused into it was widened with them — the whole layer buffer
    converted to fp32 and back on every write (SmolLM2's bf16 decode at batch 32: ~19% of its op time,
    `python -m launch.bench profile_decode --dtype=bfloat16`). Through an integer view (bitcasts) nothing
    in the keys' update is arithmetic: XLA copies the buffer (not in place) instead of converting it
    twice. Measured on
    that decode (interleaved, 5 rounds, the same tokens): keys through the view 1.27× (1.09–1.30) the
    plain write at 161 slots, 1.15× (1.00–1.22) at 256 (the blocked reads); keys and values through it
    1.12× / 1.01×, so the values keep the plain update. The same bits either way."""
    if jnp.issubdtype(dtype, jnp.floating) and jnp.dtype(dtype).itemsize == 2 and jax.default_backend() == "cpu":
        return jnp.dtype(jnp.uint16)
    return None


def _update_keys(buf: jnp.ndarray, x: jnp.ndarray, start) -> jnp.ndarray:
    """dynamic_update_slice(buf, x in buf's dtype, start), through `_bits`'s integer view where it applies."""
    x = x.astype(buf.dtype)
    bits = _bits(buf.dtype)
    if bits is None:
        return jax.lax.dynamic_update_slice(buf, x, start)
    out = jax.lax.dynamic_update_slice(jax.lax.bitcast_convert_type(buf, bits), jax.lax.bitcast_convert_type(x, bits),
                                       start)
    return jax.lax.bitcast_convert_type(out, buf.dtype)


def write_layer(k_buf: jnp.ndarray, v_buf: jnp.ndarray, k: jnp.ndarray, v: jnp.ndarray,
                index: jnp.ndarray) -> tuple[jnp.ndarray, jnp.ndarray]:
    """One layer's buffers with a chunk's k, v: [B, T, K, H] written at slot `index` (scalar, or i32[B]:
    row b at index[b]; the caller keeps index[b] + T within the capacity, as dynamic_update_slice
    would otherwise move the write back over filled slots)."""
    z = jnp.zeros((), jnp.int32)
    kt, vt = k.transpose(0, 2, 3, 1), v.transpose(0, 2, 1, 3).astype(v_buf.dtype)
    if index.ndim == 0:
        return _update_keys(k_buf, kt, (z, z, z, index)), jax.lax.dynamic_update_slice(v_buf, vt, (z, z, index, z))
    return (jax.vmap(lambda b, x, i: _update_keys(b, x, (z, z, i)))(k_buf, kt, index),
            jax.vmap(lambda b, x, i: jax.lax.dynamic_update_slice(b, x, (z, i, z)))(v_buf, vt, index))


def write(cache: KVCache, layer_kv: list[tuple[jnp.ndarray, jnp.ndarray]], positions: jnp.ndarray) -> KVCache:
    """Write a chunk's keys/values (per layer k, v: [B, T, K, H]) and positions i32[B, T] at the
    cache's index, in place when the cache buffers are donated."""
    w = cache["index"]
    kvs = [write_layer(kb, vb, k, v, w) for kb, vb, (k, v) in zip(cache["k"], cache["v"], layer_kv)]
    return KVCache(k=tuple(kb for kb, _ in kvs), v=tuple(vb for _, vb in kvs),
                   pos=write_pos(cache["pos"], positions, w), index=advance(w, positions))
