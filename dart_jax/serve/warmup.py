"""Compiling the serving engine's step shapes before requests meet them (serve.engine): a live server
must never compile on its hot path, so every bucketed shape a request can hit is run once with all
rows out of range (padding entries are dropped: nothing is admitted or written)."""

from __future__ import annotations

import jax.numpy as jnp

from dart_jax.rollout.gather import append_rows, decode_rows
from dart_jax.rollout.sampler import append, cache_bucket, decode_segment
from dart_jax.serve import slots
from dart_jax.serve.slots import admit_rows, place_prefix, request_key, row_buckets


def _settings(u: int):
    """Keys, temperatures and top-ps of `u` padding rows."""
    return jnp.stack([request_key(0)] * u), jnp.zeros(u, jnp.float32), jnp.ones(u, jnp.float32)


def compile_steps(engine, prompt_lens: tuple[int, ...] = (128,)):
    """The prefill of 1..slots prompts at each width bucket of `prompt_lens`, an append at every
    observation width (slots.obs_widths: gathered rows at each row bucket, and the whole batch), and a decode
    segment (likewise), at the engine's capacity (grown first to fit them)."""
    widths = sorted({cache_bucket(n) for n in prompt_lens})
    obs_widths = slots.obs_widths(engine.rc.max_obs_tokens)
    engine._ensure(max(widths[-1], obs_widths[-1] + 1) + 2 * engine.segment + 1)
    b, state, spec = engine.slots, engine.state, engine.spec
    params = (engine.base, engine.adapters)
    for width in widths:
        for u in row_buckets(b):
            tokens = jnp.zeros((u, width), jnp.int32)
            positions = jnp.broadcast_to(jnp.arange(width, dtype=jnp.int32), (u, width))
            state = admit_rows(*params, state, tokens, positions, jnp.full((u,), b, jnp.int32), *_settings(u),
                               spec=spec)
    for width in obs_widths:
        for u in row_buckets(b)[:-1]:
            state, _ = append_rows(*params, state, jnp.full((u,), b, jnp.int32), jnp.zeros((u, width), jnp.int32),
                                   jnp.zeros(u, jnp.int32), spec=spec)
        state, _ = append(*params, state, jnp.zeros((b, width), jnp.int32), jnp.zeros(b, jnp.int32),
                          jnp.zeros(b, bool), spec=spec)
    n_stops = len(spec.stops)
    for u in row_buckets(b)[:-1]:
        state, _ = decode_rows(*params, state, jnp.full((u,), b, jnp.int32), jnp.zeros(u, bool),
                               jnp.ones((u, n_stops), bool), jnp.ones(u, jnp.int32),
                               jnp.full((u, engine.window), -1, jnp.int32), jnp.zeros(u, bool), spec=spec,
                               length=engine.segment)
    state, _ = decode_segment(*params, state, jnp.zeros(b, bool), jnp.ones((b, n_stops), bool),
                              jnp.ones(b, jnp.int32), jnp.full((b, engine.window), -1, jnp.int32),
                              jnp.zeros(b, bool), spec=spec, length=engine.segment)
    engine.state = state


def place_prefixes(engine):
    """The placement of each learnt shared prefix (serve.prefixes) into every row bucket. Prefixes are
    learnt from live prompts, so `compile_steps` cannot compile this beforehand: run it once the first
    requests have taught one."""
    b = engine.slots
    for prefix in engine.prefixes.states():
        engine._ensure(int(prefix.cache["pos"].shape[1]) + engine.segment + 1)
        for u in row_buckets(b):
            engine.state = place_prefix(engine.state, jnp.full((u,), b, jnp.int32), *_settings(u), prefix=prefix)
