"""Attention of the transformer (models.transformer): the position mask, grouped-query softmax
attention over plain or KV-cache layouts, causal query blocks for cache-free chunks, and the block
loop over a cache's written slots for chunks that resume from a cache."""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp

from dart_jax.models import cache as cache_lib
from dart_jax.models.config import ModelConfig


def attention_mask(q_pos: jnp.ndarray, k_pos: jnp.ndarray) -> jnp.ndarray:
    """bool[B, 1, T, S]: key s is visible to query t iff 0 ≤ pos_s ≤ pos_t."""
    m = (k_pos[:, None, :] >= 0) & (k_pos[:, None, :] <= q_pos[:, :, None])
    return m[:, None, :, :]


def self_attention(cfg: ModelConfig, mask: jnp.ndarray):
    """attend() for a chunk with no cache: causal query blocks ("xla", long chunks) or one block.
    aux = the chunk's (k, v), for a prefill to write into an empty cache."""
    def attend(q, k, v):
        if cfg.attention_impl == "xla" and 0 < cfg.causal_block < q.shape[1]:
            return causal_blocked_attention(q, k, v, mask, cfg), (k, v)
        return attention(q, k, v, mask, cfg), (k, v)
    return attend


def cached_attention(cfg: ModelConfig, k_buf: jnp.ndarray, v_buf: jnp.ndarray, index: jnp.ndarray,
                     mask: jnp.ndarray):
    """attend() for a chunk resuming from a KV cache: the chunk's keys and values are written into
    this layer's buffers at `index` first, then the queries attend the whole buffer (`mask` from
    the cache positions after the write; the chunk sees itself causally through the positions).
    Write-then-read lets XLA update the donated buffer in place: reading the old buffer and
    writing it afterwards made XLA copy the cache at every layer and step.
    aux = the updated (kᵀ, v) buffers."""
    def attend(q, k, v):
        kb, vb = cache_lib.write_layer(k_buf, v_buf, k, v, index)
        blk = cfg.cache_block
        if 0 < blk < kb.shape[3] and kb.shape[3] % blk == 0:
            return filled_blocks_attention(q, kb, vb, mask, cfg, cache_lib.filled(index, q.shape[1]), blk), (kb, vb)
        return attention(q, kb, vb, mask, cfg, cache_layout=True), (kb, vb)
    return attend


def filled_blocks_attention(q: jnp.ndarray, k: jnp.ndarray, v: jnp.ndarray, mask: jnp.ndarray, cfg: ModelConfig,
                            filled: jnp.ndarray, block: int) -> jnp.ndarray:
    """`attention` over a KV cache (kᵀ [B, K, H, S], v [B, K, S, H], S a multiple of `block`) that
    reads only the blocks of slots before `filled` (the cache's write index after this chunk; the
    largest of the rows' for a per-row index): a loop over ceil(filled / block) blocks with an online
    softmax (running max, sum and output per query, fp32), so a decode step's attention costs what the cache holds, not
    its capacity. Every slot at or after `filled` is empty (position −1, never attended; zeros, as
    the cache is created and grown), so the result equals `attention` over the whole buffer up to
    fp32 rounding of the rescaling — except for a query that sees no key at all (a padding or
    finished row, whose output is discarded): 0 here, the mean of V there."""
    b, t, n, h = q.shape
    kv = k.shape[1]
    g = n // kv
    qm = q.reshape(b, t, kv, g, h).transpose(0, 2, 3, 1, 4).reshape(b, kv, g * t, h)
    low = jnp.finfo(jnp.float32).min

    def body(i, carry):
        m, denom, acc = carry
        start = i * block
        kb = jax.lax.dynamic_slice_in_dim(k, start, block, axis=3).astype(q.dtype)
        vb = jax.lax.dynamic_slice_in_dim(v, start, block, axis=2).astype(q.dtype)
        mb = jax.lax.dynamic_slice_in_dim(mask, start, block, axis=3)[:, :, None]  # [B, 1, 1, T, blk]
        sc = jnp.matmul(qm, kb, preferred_element_type=jnp.float32).reshape(b, kv, g, t, block) * (h ** -0.5)
        sc = jnp.where(mb, sc, low)
        m_new = jnp.maximum(m, sc.max(axis=-1))
        p = jnp.where(mb, jnp.exp(sc - m_new[..., None]), 0.0)
        corr = jnp.exp(m - m_new)
        pv = jnp.matmul(p.reshape(b, kv, g * t, block).astype(v.dtype), vb,
                        preferred_element_type=jnp.float32).reshape(b, kv, g, t, h)
        return m_new, denom * corr + p.sum(axis=-1), acc * corr[..., None] + pv

    init = (jnp.full((b, kv, g, t), low, jnp.float32), jnp.zeros((b, kv, g, t), jnp.float32),
            jnp.zeros((b, kv, g, t, h), jnp.float32))
    blocks = jnp.minimum((jnp.asarray(filled, jnp.int32) + block - 1) // block, k.shape[3] // block)
    _, denom, acc = jax.lax.fori_loop(0, blocks, body, init)
    o = (acc / jnp.maximum(denom, jnp.finfo(jnp.float32).tiny)[..., None]).astype(q.dtype)
    return o.transpose(0, 3, 1, 2, 4).reshape(b, t, n, h)


def causal_blocked_attention(q: jnp.ndarray, k: jnp.ndarray, v: jnp.ndarray, mask: jnp.ndarray,
                             cfg: ModelConfig) -> jnp.ndarray:
    """Self-attention of a chunk with no cache, query block by query block: block [s, e) attends
    keys [0, e) only. Exact under the position rule because positions increase along a row, so a
    key after the query block is never visible; at T = 512 with blocks of 128 it skips 37.5% of
    the score and softmax work (→ 50% as T grows). Keys and values are put in the cache layout
    once, and each block reads a prefix of them."""
    t, c = q.shape[1], cfg.causal_block
    kt, vt = k.transpose(0, 2, 3, 1), v.transpose(0, 2, 1, 3)
    outs = []
    for start in range(0, t, c):
        end = min(start + c, t)
        outs.append(attention(q[:, start:end], kt[..., :end], vt[:, :, :end], mask[:, :, start:end, :end], cfg,
                              cache_layout=True))
    return jnp.concatenate(outs, axis=1)


def attention(q: jnp.ndarray, k: jnp.ndarray, v: jnp.ndarray, mask: jnp.ndarray, cfg: ModelConfig,
              cache_layout: bool = False) -> jnp.ndarray:
    """Softmax attention of q: [B, T, N, H] over keys / values k, v: [B, S, K, H] (KV heads not
    repeated) — or, with `cache_layout`, kᵀ [B, K, H, S] and v [B, K, S, H] as the KV cache
    stores them; mask: bool[B, 1, T, S].

    "xla": grouped-query attention as two batched matmuls over (batch, KV head), the queries of a
    head's group stacked: [B, K, G·T, H] × [B, K, H, S] -> scores (fp32, masked, softmax) ×
    [B, K, S, H]. Repeated KV heads are never materialised. Written with explicit layouts because
    XLA:CPU ran the equivalent einsums with per-call transposes or as generic dots: at 4 × 512
    (SmolLM2 heads, causal blocks) the forward is 34 → 12 ms per layer, forward + backward
    64 → 53 ms; in decode the score dot went from ~1 ms per layer to its matmul kernel.
    "cudnn" / "auto": `jax.nn.dot_product_attention`, for cache-free forwards (training,
    prefill); chunks attending a cache (decode, append) use the matmuls over the cache layout."""
    if cfg.attention_impl != "xla" and not cache_layout:
        impl = None if cfg.attention_impl == "auto" else cfg.attention_impl
        return jax.nn.dot_product_attention(q, k, v, mask=mask, scale=cfg.head_dim ** -0.5, implementation=impl)
    if not cache_layout:
        k, v = k.transpose(0, 2, 3, 1), v.transpose(0, 2, 1, 3)
    b, t, n, h = q.shape
    kv = k.shape[1]
    g = n // kv
    qm = q.reshape(b, t, kv, g, h).transpose(0, 2, 3, 1, 4).reshape(b, kv, g * t, h)
    o = _grouped_softmax_attention(qm, k.astype(q.dtype), v.astype(q.dtype), mask, h ** -0.5)
    return o.reshape(b, kv, g, t, h).transpose(0, 3, 1, 2, 4).reshape(b, t, n, h)


def _scores(qm, k, bias, scale):
    """[B, K, G·T, H] × kᵀ [B, K, H, S] + the mask's bias [B, 1, G·T, S] -> fp32 scores [B, K, G·T, S]
    (MASKED where hidden)."""
    return jnp.matmul(qm, k, preferred_element_type=jnp.float32) * scale + bias


MASKED = jnp.finfo(jnp.float32).min


def _bias(mask, g: int):
    """bool[B, 1, T, S] -> fp32 [B, 1, G·T, S]: 0 where visible, MASKED where not, laid out like the
    scores. A score plus MASKED rounds to MASKED (|score| ≪ its ulp), so a hidden key's score is
    MASKED exactly, as a select gives. XLA:CPU ran the select over the mask broadcast to
    [B, K, G, T, S] at ~1.9 ns an element (4.5 ms for SmolLM2's last 128-query block at 4 × 512); this
    add over the 4-D scores, broadcast along the KV heads only, took 1.3 ms."""
    b, _, t, s = mask.shape
    bias = jnp.where(mask, 0.0, MASKED).astype(jnp.float32)
    return jnp.broadcast_to(bias[:, :, None], (b, 1, g, t, s)).reshape(b, 1, g * t, s)


@functools.partial(jax.custom_vjp, nondiff_argnums=(4,))
def _grouped_softmax_attention(qm, k, v, mask, scale: float):
    """softmax(mask(qm kᵀ · scale)) v over grouped queries qm [B, K, G·T, H], kᵀ [B, K, H, S],
    v [B, K, S, H], mask bool[B, 1, T, S] -> [B, K, G·T, H] (qm's dtype; scores and softmax fp32).

    The gradient is written by hand (as flash attention's): the forward keeps, per query, only the
    row maximum m and Σexp, and the output o [B, K, G·T, H] — not the [B, K, G, T, S] probabilities
    autodiff would store (on XLA:CPU, a scanned update zero-fills and writes a stacked buffer of them
    per layer) — and the
    backward recomputes p = exp(s − m)/Σ from one score matmul:
        dv = pᵀ do,  dp = do vᵀ,  ds = p ⊙ (dp − δ),  δ = Σ_s p dp = do · o (per query),
        dq = ds k · scale,  dk = dsᵀ q · scale.
    δ from the output (an H-long product, not a reduction over the keys) and the scale applied to
    dq, dk rather than to ds save two passes over the [B, K, G, T, S] tensors (in bf16, δ from the
    rounded o differs from Σ_s p dp by bf16 rounding, as flash attention 2's does). A hidden key has
    p = 0 exactly, so ds is 0 there with no mask applied; a query that sees no key (padding) gets the
    mean of v, as the softmax over equal scores gives, and no gradient into q or k (its row of ds is
    zeroed: its scores do not depend on them)."""
    return _gsa_fwd(qm, k, v, mask, scale)[0]


def _gsa_fwd(qm, k, v, mask, scale):
    b, kv, gt, h = qm.shape
    sc = _scores(qm, k, _bias(mask, gt // mask.shape[2]), scale)
    m = jnp.max(sc, axis=-1, keepdims=True)
    e = jnp.exp(sc - m)
    den = jnp.sum(e, axis=-1, keepdims=True)
    p = (e / den).astype(v.dtype)  # jax.nn.softmax's arithmetic
    o = jnp.matmul(p, v)
    return o, (qm, k, v, mask, m, den, o)


def _gsa_bwd(scale, res, do):
    qm, k, v, mask, m, den, o = res
    b, kv, gt, h = qm.shape
    seen = (m > MASKED).astype(jnp.float32)  # 0 for a query that sees no key
    p = jnp.exp(_scores(qm, k, _bias(mask, gt // mask.shape[2]), scale) - m) / den  # fp32
    dv = jnp.matmul(p.astype(v.dtype).swapaxes(-1, -2), do)
    dp = jnp.matmul(do, v.swapaxes(-1, -2), preferred_element_type=jnp.float32)
    delta = jnp.sum(do.astype(jnp.float32) * o.astype(jnp.float32), axis=-1, keepdims=True)
    ds = (p * ((dp - delta) * seen)).astype(qm.dtype)
    dq = jnp.matmul(ds, k.swapaxes(-1, -2), preferred_element_type=jnp.float32) * scale
    dk = jnp.matmul(qm.swapaxes(-1, -2), ds, preferred_element_type=jnp.float32) * scale
    return dq.astype(qm.dtype), dk.astype(k.dtype), dv.astype(v.dtype), None


_grouped_softmax_attention.defvjp(_gsa_fwd, _gsa_bwd)
