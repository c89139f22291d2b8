"""The engine's device side (serve.engine): jitted functions over a DecodeState of B rows whose KV cache
has a write index per row — admitting prompts into rows, placing a shared prefix's state in rows, emptying
rows — and the row / prefix bookkeeping they are sized by (appending to or decoding some rows only:
rollout.gather, shared with the batch agent loop)."""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
import numpy as np

from dart_jax.models import cache as cache_lib
from dart_jax.models.cache import KVCache
from dart_jax.models.transformer import hidden_states
from dart_jax.roles.router import route_roles, state_after
from dart_jax.rollout.gather import row_bucket
from dart_jax.rollout.sampler import (
    DecodeState,
    bucket,
    initial_keys,
    last_logits,
    sample_pending,
)
from dart_jax.rollout.sampling import RowSampling


def set_rows(a: jnp.ndarray, rows: jnp.ndarray, val) -> jnp.ndarray:
    return a.at[rows].set(val, mode="drop")  # rows ≥ len(a): padding entries, dropped


@functools.partial(jax.jit, static_argnames=("spec",), donate_argnames=("state",))
def admit_rows(base, adapters, state: DecodeState, tokens: jnp.ndarray, positions: jnp.ndarray, rows: jnp.ndarray,
           keys: jax.Array, temperature: jnp.ndarray, top_p: jnp.ndarray, *, spec) -> DecodeState:
    """Prefill U left-padded prompts (tokens, positions: i32[U, T]) alone, sample each one's first token
    with its own key and settings, and place them in rows `rows` (i32[U]; ≥ B: padding) of the
    engine's state: the row's cache is replaced (slots [0, T) hold the prompt, the rest is empty) and
    its per-row fields are set. The state's capacity must be ≥ T."""
    u, t = tokens.shape
    cache = state.cache
    fresh = cache_lib.init_cache(spec.model, u, t, cache["k"][0].dtype)
    valid = positions >= 0
    routes = spec.routes(route_roles(tokens, spec.router, valid))
    x, fresh = hidden_states(base, adapters, tokens, positions, routes, fresh, cfg=spec.model, cache_is_empty=True)
    logits = last_logits(base, spec.model, x, jnp.full((u,), t - 1))
    router0 = state_after(jnp.where(valid, tokens, -1), spec.router)
    next_pos = jnp.max(positions, axis=1) + 1
    sampling = RowSampling(temperature=temperature, top_p=top_p)
    tok, lp, route, router = sample_pending(router0, logits, keys, next_pos, spec, sampling)
    s = cache["pos"].shape[1]
    new_cache = KVCache(
        k=tuple(kb.at[rows, :, :, :t].set(fk, mode="drop") for kb, fk in zip(cache["k"], fresh["k"])),
        v=tuple(vb.at[rows, :, :t, :].set(fv, mode="drop") for vb, fv in zip(cache["v"], fresh["v"])),
        pos=set_rows(cache["pos"], rows, jnp.pad(fresh["pos"], ((0, 0), (0, s - t)), constant_values=-1)),
        index=set_rows(cache["index"], rows, jnp.full((u,), t, jnp.int32)))
    old = state.sampling
    return DecodeState(cache=new_cache, pending=set_rows(state.pending, rows, tok),
                       pending_lp=set_rows(state.pending_lp, rows, lp),
                       pending_route=set_rows(state.pending_route, rows, route),
                       router=set_rows(state.router, rows, router), next_pos=set_rows(state.next_pos, rows, next_pos),
                       keys=set_rows(state.keys, rows, keys),
                       sampling=RowSampling(temperature=set_rows(old.temperature, rows, temperature),
                                            top_p=set_rows(old.top_p, rows, top_p)))


@functools.partial(jax.jit, donate_argnames=("state",))
def place_prefix(state: DecodeState, rows: jnp.ndarray, keys: jax.Array, temperature: jnp.ndarray,
                  top_p: jnp.ndarray, prefix: DecodeState) -> DecodeState:
    """Rows `rows` (i32[U]; ≥ B: padding) start from `prefix`, a one-row state of a shared prompt prefix
    prefilled with its last token held pending (sampler.prefill(hold_last=True)): its W KV slots, write
    index W, pending token, route, router state and next position; each row with its own key and
    sampling settings. The state's capacity must be ≥ W."""
    c, pc = state.cache, prefix.cache
    u, w, s = rows.shape[0], pc["pos"].shape[1], c["pos"].shape[1]

    def rows_of(a):  # the prefix's one row for each of the U rows
        return jnp.broadcast_to(a, (u,) + a.shape[1:])
    new_cache = KVCache(
        k=tuple(kb.at[rows, :, :, :w].set(rows_of(pk), mode="drop") for kb, pk in zip(c["k"], pc["k"])),
        v=tuple(vb.at[rows, :, :w, :].set(rows_of(pv), mode="drop") for vb, pv in zip(c["v"], pc["v"])),
        pos=set_rows(c["pos"], rows, rows_of(jnp.pad(pc["pos"], ((0, 0), (0, s - w)), constant_values=-1))),
        index=set_rows(c["index"], rows, jnp.full((u,), w, jnp.int32)))
    old = state.sampling
    return DecodeState(cache=new_cache, pending=set_rows(state.pending, rows, rows_of(prefix.pending)),
                       pending_lp=set_rows(state.pending_lp, rows, jnp.zeros((u,), jnp.float32)),
                       pending_route=set_rows(state.pending_route, rows, rows_of(prefix.pending_route)),
                       router=set_rows(state.router, rows, rows_of(prefix.router)),
                       next_pos=set_rows(state.next_pos, rows, rows_of(prefix.next_pos)),
                       keys=set_rows(state.keys, rows, keys),
                       sampling=RowSampling(temperature=set_rows(old.temperature, rows, temperature),
                                            top_p=set_rows(old.top_p, rows, top_p)))


def common_prefix(a, b) -> int:
    """Length of the longest common prefix of two token sequences."""
    n = min(len(a), len(b))
    diff = np.nonzero(np.asarray(a[:n]) != np.asarray(b[:n]))[0]
    return int(diff[0]) if len(diff) else n


def row_buckets(slots: int) -> list[int]:
    return sorted({row_bucket(n, slots) for n in range(1, slots + 1)})


def row_pieces(n: int, slots: int) -> list[int]:
    """A batch of `n` of the engine's `slots` rows as pieces with no padding row, for encoding (compute-bound:
    a padding row costs as much as a real one): the whole batch when n == slots, else n's powers of two,
    largest first (5 -> [4, 1]). Every piece is a row bucket, so no new shape is compiled."""
    if n == slots:
        return [slots]
    return [1 << k for k in reversed(range(n.bit_length())) if n >> k & 1]


OBS_OCTAVE_STEPS = 4  # above 256 columns, each octave of observation widths split in this many steps


def obs_width(n: int) -> int:
    """Columns an appended chunk of `n` tokens (an observation, or a prompt's rest after a shared prefix) is
    padded to: 16, 32, 64, 128, 256, then quarter octaves — 320, 384, 448, 512, 640, … — so a top-3 NQ
    observation of ~390 tokens encodes 448 columns, not 512."""
    if n <= 256:
        return bucket(n)
    step = (1 << (n - 1).bit_length() - 1) // OBS_OCTAVE_STEPS
    return -(-n // step) * step


def obs_widths(most: int) -> list[int]:
    """Every width `obs_width` gives for 1..`most` tokens."""
    out, n = [], 1
    while n <= most:
        out.append(obs_width(n))
        n = out[-1] + 1
    return out


PREFIX_STEP = 16  # shared prefixes are cut to a multiple of this: fewer distinct prefixes, fewer shapes


@functools.partial(jax.jit, donate_argnames=("state",))
def reset_rows(state: DecodeState, rows: jnp.ndarray) -> DecodeState:
    """Rows `rows` (bool[B]) emptied: write index 0, every slot's position −1."""
    c = state.cache
    return state.replace(cache=KVCache(k=c["k"], v=c["v"], pos=jnp.where(rows[:, None], -1, c["pos"]),
                                       index=jnp.where(rows, 0, c["index"])))


def request_key(seed: int, row: int = 0) -> jax.Array:
    """A request's sampling key: row `row`'s key of a batch sampled with `seed` (sampler.initial_keys)."""
    return initial_keys(jax.random.PRNGKey(seed), 1, row)[0]
