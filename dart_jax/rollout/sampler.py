"""The JAX sampler: prefill, a jitted decode loop over a preallocated KV cache, and appends that
resume a paused batch from its cache (tool observations) without recomputing anything earlier.

State between calls is one `DecodeState`. Every row always holds a *pending* token: sampled (its
log-prob and route already known) but not yet written to the cache. A decode segment records the
pending token, then repeatedly consumes it (one forward step) and samples the next, until the row
hits a stop sequence or the segment's budget. An append consumes the pending token followed by the
observation ids in one forward, then samples a new pending token from the last observation
position. Rows that are finished run along with position −1, so their cache slots are masked.

Sampling keys: every draw is keyed by (seed, row, position): `DecodeState.keys` holds one key per
row, folded with the position the sampled token will occupy. A row's tokens therefore depend on its
prompt, the seed and its row index only, never on how decoding was split into segments and appends
or which other rows share a step (the two-policy composition relies on it: rollout.compose).

Routing: the router's incremental state advances when a token is sampled, so each token's route
(the adapter used at the position the token occupies) is known before the token is consumed.
"""

from __future__ import annotations

import dataclasses
import functools

import flax.struct
import jax
import jax.numpy as jnp

from dart_jax.adapters.method import ROUTE_MODES, mode_routes
from dart_jax.models import cache as cache_lib, dots
from dart_jax.models.cache import KVCache
from dart_jax.models.config import ModelConfig
from dart_jax.models.transformer import hidden_states, output_head
from dart_jax.roles.router import RouterSpec, route_roles, route_step, state_after
from dart_jax.rollout.placement import RolloutMesh, constrain
from dart_jax.rollout.sampling import RowSampling, SamplingConfig, sample, sample_rows

RUNNING, STOPPED, LENGTH = 0, 1, 2
BUCKETS = (16, 32, 64, 128, 256, 512, 1024, 2048, 4096, 8192)


def bucket(n: int) -> int:
    """Smallest bucket ≥ n, so segment and chunk lengths compile a bounded number of times."""
    for b in BUCKETS:
        if n <= b:
            return b
    return -(-n // BUCKETS[-1]) * BUCKETS[-1]


@dataclasses.dataclass(frozen=True)
class SamplerSpec:
    """Static configuration of the sampler (a jit static argument)."""

    model: ModelConfig
    router: RouterSpec
    sampling: SamplingConfig
    stops: tuple[tuple[int, ...], ...]
    route_mode: str = "role"  # adapters.method.ROUTE_MODES (a method's `route_mode`): roles -> route ids
    placement: RolloutMesh | None = None  # the run's mesh: decode state sharded on it (rollout.placement)

    def __post_init__(self):
        if self.route_mode not in ROUTE_MODES:
            raise ValueError(f"route_mode={self.route_mode!r}; expected one of {ROUTE_MODES}")
        if not self.stops or any(len(s) == 0 for s in self.stops):
            raise ValueError("stop sequences must be non-empty token-id tuples")

    def routes(self, roles: jnp.ndarray) -> jnp.ndarray:
        return mode_routes(self.route_mode, roles)


@flax.struct.dataclass
class DecodeState:
    cache: KVCache
    pending: jnp.ndarray        # i32[B] sampled, not yet in the cache
    pending_lp: jnp.ndarray     # f32[B] its log-prob at the sampling temperature
    pending_route: jnp.ndarray  # i32[B] adapter route of the position it will occupy
    router: jnp.ndarray         # bool[B] router state after the pending token
    next_pos: jnp.ndarray       # i32[B] position the pending token will occupy
    keys: jax.Array             # u32[B, 2] per-row sampling key (folded with each draw's position)
    sampling: RowSampling | None = None  # per-row temperature / top-p (serve.engine); None: spec.sampling


@flax.struct.dataclass
class Segment:
    tokens: jnp.ndarray    # i32[B, N] recorded tokens (−1 past `count`)
    logprobs: jnp.ndarray  # f32[B, N]
    routes: jnp.ndarray    # i32[B, N] route of each token's position
    count: jnp.ndarray     # i32[B]
    finish: jnp.ndarray    # i32[B] RUNNING (inactive rows) / STOPPED / LENGTH
    stop_index: jnp.ndarray  # i32[B] which stop sequence ended the row (−1 none)


@functools.partial(jax.jit, static_argnames=("capacity", "placement"))
def grow_state(state: DecodeState, *, capacity: int, placement: RolloutMesh | None = None) -> DecodeState:
    return constrain(state.replace(cache=cache_lib.grow(constrain(state.cache, placement), capacity)), placement)


CACHE_STEP = 256


def cache_bucket(need: int) -> int:
    """Capacity for `need` slots: power-of-two buckets up to 512, then multiples of CACHE_STEP (at
    most CACHE_STEP slots held beyond the need; every capacity ≥ 128 is a multiple of the default
    cache_block, so the block loop applies)."""
    return bucket(need) if need <= 2 * CACHE_STEP else -(-need // CACHE_STEP) * CACHE_STEP


def ensure_capacity(state: DecodeState, need: int, placement: RolloutMesh | None = None) -> DecodeState:
    """Grow the cache to cache_bucket(need) slots when it holds fewer: near what the episode has used
    (one copy per growth, a bounded number of compiled shapes) instead of preallocated for the
    longest episode, so a batch of short episodes holds a short cache. Decode attention reads only
    the written blocks of `cache_block` slots (models.attention.filled_blocks_attention), not the
    capacity."""
    if cache_lib.capacity(state.cache) >= need:
        return state
    return grow_state(state, capacity=cache_bucket(need), placement=placement)


def cache_used(state: DecodeState) -> int:
    return int(state.cache["index"])


def last_logits(base, cfg, x, index):
    """x: [B, T, D] hidden -> f32[B, V] logits at per-row index (only that position's head)."""
    h = jnp.take_along_axis(x, index[:, None, None], axis=1)[:, 0]
    return dots.einsum("bd,dv->bv", h, output_head(base, cfg).astype(h.dtype)).astype(jnp.float32)


def draw_keys(keys: jax.Array, pos: jnp.ndarray) -> jax.Array:
    """Per-row keys for the draw of the token that will occupy position pos[b]."""
    return jax.vmap(jax.random.fold_in)(keys, pos)


def initial_keys(rng: jax.Array, b: int, row_offset=0) -> jax.Array:
    """One sampling key per row of a rollout batch: row b's key is fold_in(rng, row_offset + b) (a
    process rolling out rows [o, o + b) of a multi-process batch draws as the single process would)."""
    return jax.vmap(lambda i: jax.random.fold_in(rng, i))(jnp.arange(b, dtype=jnp.int32) + row_offset)


def sample_pending(state_router, logits, keys, pos, spec: SamplerSpec, rows: RowSampling | None = None):
    if rows is None:
        tok, lp = sample(logits, draw_keys(keys, pos), spec.sampling)
    else:
        tok, lp = sample_rows(logits, draw_keys(keys, pos), rows, spec.sampling.top_k)
    router, role = route_step(state_router, tok, spec.router)
    return tok, lp, spec.routes(role), router


def prefill(base, adapters, tokens: jnp.ndarray, positions: jnp.ndarray, cache: KVCache,
            rng: jax.Array, rows: jnp.ndarray | None = None, row_offset=0, *, spec: SamplerSpec,
            hold_last: bool = False, sampling: RowSampling | None = None) -> tuple[DecodeState, jnp.ndarray]:
    """See `_prefill`. The fresh cache is donated when it becomes the state's cache (no `rows`); with
    `rows` the state's cache is a new, larger array, so nothing is donated. A prompt that leaves no
    position of the model's context (max_position_embeddings) for a response is refused (ValueError)
    before the forward: the rollouts refuse such prompts earlier, by rollout.tasks.overlong."""
    if not isinstance(positions, jax.core.Tracer):
        longest, context = int(jnp.max(positions)) + 1, spec.model.max_position_embeddings
        if longest >= context:
            raise ValueError(f"a prompt of {longest} tokens leaves no room for a response in the model's context of "
                             f"{context} positions")
    if rows is None:
        return _prefill_in_place(base, adapters, tokens, positions, cache, rng, None, row_offset, sampling,
                                 spec=spec, hold_last=hold_last)
    return _prefill_broadcast(base, adapters, tokens, positions, cache, rng, rows, row_offset, sampling, spec=spec,
                              hold_last=hold_last)


def _prefill(base, adapters, tokens: jnp.ndarray, positions: jnp.ndarray, cache: KVCache,
             rng: jax.Array, rows: jnp.ndarray | None = None, row_offset=0, sampling: RowSampling | None = None, *,
             spec: SamplerSpec, hold_last: bool = False) -> tuple[DecodeState, jnp.ndarray]:
    """tokens, positions: i32[U, T] left-padded prompts (−1 positions on padding); `cache` must be
    fresh (index 0): its contents are not attended. `rows` (i32[B], optional): row b of the batch
    continues prompt rows[b], so a GRPO group's G samples share one prefill of their prompt and the
    cache is broadcast to them (without `rows`, B = U and row b is prompt b).
    `hold_last`: encode all but each prompt's last token and leave that token pending (nothing is
    sampled): the state of a policy that has not written yet and resumes with `append` from
    whatever the trajectory holds when it first gets control (rollout.compose).
    `sampling` (per row of the B): each row's temperature / top-p as data (the state carries it to every
    later draw), so one compiled program serves greedy and sampled rollouts alike; None: spec.sampling.
    -> (state with the first response token pending, prompt routes i32[B, T])."""
    place = spec.placement
    cache = constrain(cache, place)
    valid = positions >= 0
    roles = route_roles(tokens, spec.router, valid)
    routes = spec.routes(roles)
    enc = (tokens[:, :-1], positions[:, :-1], routes[:, :-1]) if hold_last else (tokens, positions, routes)
    x, cache = hidden_states(base, adapters, *enc, cache, cfg=spec.model, cache_is_empty=True)
    logits = None if hold_last else last_logits(base, spec.model, x, jnp.full((tokens.shape[0],), tokens.shape[1] - 1))
    if rows is not None:
        def take(a):
            return jnp.take(a, rows, axis=0)
        cache = KVCache(k=tuple(map(take, cache["k"])), v=tuple(map(take, cache["v"])), pos=take(cache["pos"]),
                        index=cache["index"])
        tokens, positions, valid, routes = map(take, (tokens, positions, valid, routes))
        logits = None if logits is None else take(logits)
    keys = initial_keys(rng, tokens.shape[0], row_offset)
    if hold_last:  # left padding: every prompt's last token is in the last column
        router, role = route_step(state_after(jnp.where(valid, tokens, -1)[:, :-1], spec.router), tokens[:, -1],
                                  spec.router)
        return constrain(DecodeState(cache=cache, pending=tokens[:, -1],
                                     pending_lp=jnp.zeros(tokens.shape[:1], jnp.float32),
                                     pending_route=spec.routes(role), router=router, next_pos=positions[:, -1],
                                     keys=keys, sampling=sampling), place), routes
    router0 = state_after(jnp.where(valid, tokens, -1), spec.router)
    next_pos = jnp.max(positions, axis=1) + 1
    tok, lp, route, router = sample_pending(router0, logits, keys, next_pos, spec, sampling)
    return constrain(DecodeState(cache=cache, pending=tok, pending_lp=lp, pending_route=route, router=router,
                                 next_pos=next_pos, keys=keys, sampling=sampling), place), routes


_prefill_in_place = jax.jit(_prefill, static_argnames=("spec", "hold_last"), donate_argnames=("cache",))
_prefill_broadcast = jax.jit(_prefill, static_argnames=("spec", "hold_last"))


def lower_prefill(base, adapters, tokens: jnp.ndarray, positions: jnp.ndarray, cache: KVCache, rng: jax.Array, *,
                  spec: SamplerSpec, hold_last: bool = False):
    """The program `prefill` runs for these arguments (no `rows`), lowered: its compiled text is what a
    profile joins the executed instructions to (bench.profile)."""
    return _prefill_in_place.lower(base, adapters, tokens, positions, cache, rng, None, 0, None, spec=spec,
                                   hold_last=hold_last)


def _stop_hit(hist: jnp.ndarray, stops, enabled: jnp.ndarray) -> jnp.ndarray:
    """hist: i32[B, K] last K tokens (newest last) -> i32[B] index of the first matching enabled
    stop sequence, −1 if none."""
    hit = jnp.full(hist.shape[:1], -1, jnp.int32)
    for i in reversed(range(len(stops))):
        seq = jnp.asarray(stops[i], jnp.int32)
        match = jnp.all(hist[:, hist.shape[1] - len(stops[i]):] == seq, axis=1) & enabled[:, i]
        hit = jnp.where(match, i, hit)
    return hit


def _merge(mask: jnp.ndarray, new: DecodeState, old: DecodeState) -> DecodeState:
    """Per-row fields from `new` where mask, else from `old`; cache and keys from `new` (finished
    rows wrote only masked slots)."""
    pick = lambda a, b: jnp.where(mask, a, b)  # noqa: E731
    return new.replace(pending=pick(new.pending, old.pending), pending_lp=pick(new.pending_lp, old.pending_lp),
                       pending_route=pick(new.pending_route, old.pending_route),
                       router=pick(new.router, old.router), next_pos=pick(new.next_pos, old.next_pos))


def stop_window(spec: SamplerSpec) -> int:
    """Tokens of history the stop check looks at (the longest stop sequence)."""
    return max(len(s) for s in spec.stops)


@functools.partial(jax.jit, static_argnames=("spec", "length"), donate_argnames=("state",))
def decode_segment(base, adapters, state: DecodeState, active: jnp.ndarray, stop_enabled: jnp.ndarray,
                   budget: jnp.ndarray, history: jnp.ndarray | None = None, recorded: jnp.ndarray | None = None,
                   *, spec: SamplerSpec, length: int) -> tuple[DecodeState, Segment]:
    """Generate up to budget[b] (1 ≤ budget ≤ `length`, the bucket) tokens for each `active` row.

    active: bool[B]; stop_enabled: bool[B, S] per-row switch of each stop sequence (e.g. the tool
    stop is off in the final answer-only segment). Writes (steps taken − 1) cache slots.
    A turn decoded in several segments (serve.engine) passes `history` i32[B, stop_window] (each
    row's last tokens so far, −1 where fewer; a stop sequence split across segments still ends
    the row) and `recorded` bool[B]: rows whose pending token an earlier segment already returned
    (it is consumed, not returned again, and does not count against the budget)."""
    state = constrain(state, spec.placement)
    b = active.shape[0]
    k = stop_window(spec)
    out_tok = jnp.full((b, length), -1, jnp.int32)
    out_lp = jnp.zeros((b, length), jnp.float32)
    out_route = jnp.full((b, length), -1, jnp.int32)

    rows = jnp.arange(b)

    def record(n, running, tok, lp, route, outs, hist, count):
        out_tok, out_lp, out_route = outs
        if recorded is None:  # every running row has returned n tokens: column n
            out_tok = out_tok.at[:, n].set(jnp.where(running, tok, -1))
            out_lp = out_lp.at[:, n].set(jnp.where(running, lp, 0.0))
            out_route = out_route.at[:, n].set(jnp.where(running, route, -1))
        else:  # rows that skipped their pending token are a column behind: each at its own count
            col = jnp.where(running, count, length)  # out of range: dropped
            out_tok = out_tok.at[rows, col].set(tok, mode="drop")
            out_lp = out_lp.at[rows, col].set(lp, mode="drop")
            out_route = out_route.at[rows, col].set(route, mode="drop")
        hist = jnp.where(running[:, None], jnp.concatenate([hist[:, 1:], tok[:, None]], axis=1), hist)
        hit = jnp.where(running, _stop_hit(hist, spec.stops, stop_enabled), -1)
        return (out_tok, out_lp, out_route), hist, hit

    hist = jnp.full((b, k), -1, jnp.int32) if history is None else history.astype(jnp.int32)
    first = active if recorded is None else active & ~recorded
    outs, hist, hit = record(0, first, state.pending, state.pending_lp, state.pending_route,
                             (out_tok, out_lp, out_route), hist, jnp.zeros((b,), jnp.int32))
    count = first.astype(jnp.int32)
    done = ~active | (hit >= 0) | (count >= budget)

    def cond(carry):
        n, _, _, _, done, _, _ = carry
        return (n <= length) & ~jnp.all(done)  # a row that skipped its pending token may record `length`

    def body(carry):
        n, state, outs, hist, done, count, stop_idx = carry
        running = ~done
        pos = jnp.where(running, state.next_pos, -1)
        route = jnp.where(running, state.pending_route, -1)
        x, cache = hidden_states(base, adapters, state.pending[:, None], pos[:, None], route[:, None],
                                 state.cache, cfg=spec.model)
        logits = last_logits(base, spec.model, x, jnp.zeros((b,), jnp.int32))
        tok, lp, new_route, router = sample_pending(state.router, logits, state.keys, state.next_pos + 1, spec,
                                                     state.sampling)
        new = DecodeState(cache=cache, pending=tok, pending_lp=lp, pending_route=new_route, router=router,
                          next_pos=state.next_pos + 1, keys=state.keys, sampling=state.sampling)
        state = constrain(_merge(running, new, state), spec.placement)  # the loop carry keeps its layout
        outs, hist, hit = record(n, running, tok, lp, new_route, outs, hist, count)
        stop_idx = jnp.where(hit >= 0, hit, stop_idx)
        count = count + running
        return n + 1, state, outs, hist, done | (hit >= 0) | (count >= budget), count, stop_idx

    carry = (jnp.asarray(1, jnp.int32), state, outs, hist, done, count, hit)
    _, state, (out_tok, out_lp, out_route), _, done, count, stop_idx = jax.lax.while_loop(cond, body, carry)
    finish = jnp.where(~active, RUNNING, jnp.where(stop_idx >= 0, STOPPED, LENGTH))
    return constrain(state, spec.placement), Segment(tokens=out_tok, logprobs=out_lp, routes=out_route, count=count,
                                                     finish=finish, stop_index=stop_idx)


@functools.partial(jax.jit, static_argnames=("spec",), donate_argnames=("state",))
def append(base, adapters, state: DecodeState, obs: jnp.ndarray, obs_len: jnp.ndarray,
           do_append: jnp.ndarray, *, spec: SamplerSpec) -> tuple[DecodeState, jnp.ndarray]:
    """Consume each appending row's pending token followed by its observation ids, then sample a
    new pending token from the last observation position.

    obs: i32[B, To] right-padded; obs_len: i32[B]; do_append: bool[B]. Writes To + 1 cache slots
    (padding slots carry position −1). -> (state, routes i32[B, To] of the observation positions)."""
    state = constrain(state, spec.placement)
    b, to = obs.shape
    idx = jnp.arange(to, dtype=jnp.int32)
    obs_valid = (idx[None] < obs_len[:, None]) & do_append[:, None]
    chunk = jnp.concatenate([state.pending[:, None], obs], axis=1)
    valid = jnp.concatenate([do_append[:, None], obs_valid], axis=1)
    pos = jnp.where(valid, state.next_pos[:, None] + jnp.arange(to + 1, dtype=jnp.int32)[None], -1)

    def step(r, t):
        r2, role = route_step(r, t, spec.router)
        return r2, role
    router_end, obs_roles = jax.lax.scan(step, state.router, jnp.where(obs_valid, obs, -1).T)
    obs_routes = jnp.where(obs_valid, spec.routes(obs_roles.T), -1)
    routes = jnp.concatenate([jnp.where(do_append, state.pending_route, -1)[:, None], obs_routes], axis=1)
    x, cache = hidden_states(base, adapters, chunk, pos, routes, state.cache, cfg=spec.model)
    logits = last_logits(base, spec.model, x, jnp.maximum(obs_len, 0))
    next_pos = state.next_pos + obs_len + 1
    tok, lp, route, router = sample_pending(router_end, logits, state.keys, next_pos, spec, state.sampling)
    new = DecodeState(cache=cache, pending=tok, pending_lp=lp, pending_route=route, router=router,
                      next_pos=next_pos, keys=state.keys, sampling=state.sampling)
    state = _merge(do_append, new, state)
    return constrain(state, spec.placement), obs_routes
