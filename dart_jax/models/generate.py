"""Greedy KV-cached decoding (the reference decode used by parity checks and benchmarks).

The full agentic sampler (temperature / top-p, stop sequences, tool pauses, routing state) lives in
`dart_jax.rollout`; this is the minimal exact loop: prefill once, then one token per step from the
cache, per-row positions so left-padded prompts decode correctly.
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp

from dart_jax.models import dots
from dart_jax.models.cache import init_cache
from dart_jax.models.config import ModelConfig
from dart_jax.models.transformer import forward, hidden_states, output_head


def left_pad(prompts: list[list[int]], pad_id: int = 0) -> tuple[jnp.ndarray, jnp.ndarray]:
    """-> tokens i32[B, T], positions i32[B, T] (−1 on padding)."""
    t = max(len(p) for p in prompts)
    toks = [[pad_id] * (t - len(p)) + list(p) for p in prompts]
    pos = [[-1] * (t - len(p)) + list(range(len(p))) for p in prompts]
    return jnp.asarray(toks, jnp.int32), jnp.asarray(pos, jnp.int32)


@functools.partial(jax.jit, static_argnames=("cfg", "max_new_tokens"))
def greedy_generate(base, adapters, tokens: jnp.ndarray, positions: jnp.ndarray, *,
                    cfg: ModelConfig, max_new_tokens: int) -> jnp.ndarray:
    """tokens, positions: i32[B, T] (left-padded) -> i32[B, max_new_tokens] greedy continuation.
    Adapters, when given, apply with route 0 everywhere (routing per token is the sampler's job)."""
    b, t = tokens.shape
    routes = None if adapters is None else jnp.zeros((b, t), jnp.int32)
    cache = init_cache(cfg, b, t + max_new_tokens)
    x, cache = hidden_states(base, adapters, tokens, positions, routes, cache, cfg=cfg, cache_is_empty=True)
    logits = dots.einsum("btd,dv->btv", x[:, -1:], output_head(base, cfg).astype(x.dtype)).astype(jnp.float32)
    first = jnp.argmax(logits[:, -1], axis=-1).astype(jnp.int32)
    next_pos = jnp.max(positions, axis=1) + 1
    out = jnp.zeros((b, max_new_tokens), jnp.int32)
    step_routes = None if adapters is None else jnp.zeros((b, 1), jnp.int32)

    def step(i, carry):
        cache, tok, pos, out = carry
        out = out.at[:, i].set(tok)
        logits, cache = forward(base, adapters, tok[:, None], pos[:, None], step_routes, cache, cfg=cfg)
        return cache, jnp.argmax(logits[:, 0], axis=-1).astype(jnp.int32), pos + 1, out

    _, _, _, out = jax.lax.fori_loop(0, max_new_tokens, step, (cache, first, next_pos, out))
    return out
