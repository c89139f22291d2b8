"""Decoding and appending only the rows that need it: a KV-cache state of B rows whose rows are gathered
into a bucket of U < B rows (1, 2, 4, …), run, and scattered back, so that a step costs U rows' forwards,
not B. The serving engine (serve.engine) decodes its running rows this way; the batch-synchronous agent
loop (rollout.agent.SinglePolicy, rollout.compose.TwoPolicies) does too once rows finish or pause, where
the last turns of a batch often run one or two rows of eight (`RolloutConfig.gather_rows`).

Every row keeps its own sampling key, position and router state, so a gathered row draws what it would
in the whole batch; the forward of U rows rounds its matmuls as a batch of U does (log-probs within
~1e-6 of the whole batch's)."""

from __future__ import annotations

import dataclasses
import functools
import logging

import jax
import jax.numpy as jnp
import numpy as np

from dart_jax.rollout.placement import RolloutMesh
from dart_jax.rollout.sampler import RUNNING, DecodeState, Segment, append, decode_segment

log = logging.getLogger(__name__)


def row_bucket(n: int, slots: int) -> int:
    """Rows a batch of `n` of the engine's `slots` rows is padded to: 1, 2, 4, ... capped at `slots`."""
    return min(1 << max(0, n - 1).bit_length(), slots)


def _take(state: DecodeState, rows: jnp.ndarray) -> DecodeState:
    """The rows' state. A scalar (the batch sampler's one cache write index, shared by every row) is kept."""
    b = state.pending.shape[0]
    return jax.tree_util.tree_map(lambda a: a if a.ndim == 0 else a[jnp.minimum(rows, b - 1)], state)


def _put(state: DecodeState, rows: jnp.ndarray, sub: DecodeState) -> DecodeState:
    """`sub`'s rows written back; a shared scalar takes `sub`'s value (the write index moved on for every row:
    the rows not run have position −1 in the slots it passed, as an inactive row of the whole batch does)."""
    return jax.tree_util.tree_map(lambda a, x: x if a.ndim == 0 else a.at[rows].set(x, mode="drop"), state, sub)


@functools.partial(jax.jit, static_argnames=("spec",), donate_argnames=("state",))
def append_rows(base, adapters, state: DecodeState, rows: jnp.ndarray, obs: jnp.ndarray, obs_len: jnp.ndarray, *,
                spec) -> tuple[DecodeState, jnp.ndarray]:
    """sampler.append on rows `rows` (i32[U]; ≥ B: padding) only: their state gathered, each one's pending
    token and observation (obs i32[U, W] right-padded, obs_len i32[U]) encoded as a [U, W + 1] chunk and
    sampled from, and scattered back. A forward of U rows, not of the state's B (rows pause for their tool
    and come back at different times). -> (state, routes i32[U, W] of the observation positions)."""
    sub, routes = append(base, adapters, _take(state, rows), obs, obs_len, rows < state.pending.shape[0], spec=spec)
    return _put(state, rows, sub), routes


@functools.partial(jax.jit, static_argnames=("spec", "length"), donate_argnames=("state",))
def decode_rows(base, adapters, state: DecodeState, rows: jnp.ndarray, active: jnp.ndarray, stop_enabled: jnp.ndarray,
                budget: jnp.ndarray, history: jnp.ndarray | None, recorded: jnp.ndarray | None, *, spec,
                length: int) -> tuple[DecodeState, Segment]:
    """sampler.decode_segment on rows `rows` (i32[U]; ≥ B: padding) only, gathered and scattered back
    as `append_rows` does: a segment costs U rows' forwards, not the state's B, when only U rows are
    decoding. The per-row arguments are [U, ...] (padding rows inactive; history / recorded may be None,
    as decode_segment's). -> (state, the segment of the U rows)."""
    b = state.pending.shape[0]
    sub, seg = decode_segment(base, adapters, _take(state, rows), active & (rows < b), stop_enabled, budget, history,
                              recorded, spec=spec, length=length)
    return _put(state, rows, sub), seg


# memory maps a compiled program adds to the process on XLA:CPU, per model layer (jax 0.10.2: 1,373-1,378 for
# an append of SmolLM2-135M's 30 layers); the LLVM JIT fails ("Cannot allocate memory") past vm.max_map_count
MAPS_PER_LAYER = 47
# gathering compiles a decode and an append per row bucket beside the batch's own programs: it is used where
# the memory-map limit holds at least this many programs of the model (Linux's default 65,530 holds ~46 of
# SmolLM2-135M's, which a run's batch and update programs need for themselves)
GATHER_PROGRAMS = 200
_FITS: dict[tuple[int, str], bool] = {}


def map_count_holds(layers: int, path: str = "/proc/sys/vm/max_map_count") -> tuple[int, int] | None:
    """On XLA:CPU: (vm.max_map_count, how many compiled programs of a `layers`-layer model it holds);
    None on another backend or where the limit is unreadable."""
    if jax.default_backend() != "cpu":
        return None
    try:
        with open(path) as f:
            limit = int(f.read())
    except (OSError, ValueError):
        return None
    return limit, limit // (MAPS_PER_LAYER * max(layers, 1))


def gather_fits(layers: int, path: str = "/proc/sys/vm/max_map_count") -> bool:
    """Whether this process may compile the gathered programs of a `layers`-layer model: False, said once
    (at INFO: the default asked for it, the user did not), where XLA:CPU's memory-map limit holds fewer than
    GATHER_PROGRAMS of them."""
    key = (layers, path)
    if key not in _FITS:
        got = map_count_holds(layers, path)
        _FITS[key] = got is None or got[1] >= GATHER_PROGRAMS
        if not _FITS[key]:
            log.info("rollout.gather_rows: on XLA:CPU vm.max_map_count = %d holds ~%d compiled programs of this "
                     "%d-layer model, too few for the gathered decode and append programs beside the run's own: "
                     "batches decode every row with a mask (the same trajectories, slower). To gather: sudo "
                     "sysctl -w vm.max_map_count=1048576", got[0], got[1], layers)
    return _FITS[key]


def gather_plan(mask: np.ndarray, gather_rows: int, placement: RolloutMesh | None, layers: int) -> np.ndarray | None:
    """The rows i32[U] (padded with B) to run for the rows of `mask` (bool[B]) gathered, or None for the
    whole batch with a mask: when the batch has fewer than `gather_rows` rows (0: never gather), when
    the rows' bucket is the whole batch, when no row is set, on a mesh of several devices (a bucket
    of U rows need not divide over its batch axis), or where the memory-map limit is low (`gather_fits`)."""
    b = len(mask)
    if not gather_rows or b < gather_rows or (placement is not None and placement.mesh.size > 1):
        return None
    live = np.nonzero(mask)[0]
    u = row_bucket(len(live), b)
    if not len(live) or u >= b or not gather_fits(layers):
        return None
    rows = np.full(u, b, np.int32)
    rows[:len(live)] = live
    return rows


def full_segment(seg: Segment, rows: np.ndarray, b: int) -> Segment:
    """A gathered segment (host arrays of U rows) as the whole batch's: the rows not run hold what an
    inactive row of decode_segment holds (no tokens, RUNNING, no stop)."""
    real = rows < b
    at = rows[real]
    length = seg.tokens.shape[1]
    out = Segment(tokens=np.full((b, length), -1, np.int32), logprobs=np.zeros((b, length), np.float32),
                  routes=np.full((b, length), -1, np.int32), count=np.zeros(b, np.int32),
                  finish=np.full(b, RUNNING, np.int32), stop_index=np.full(b, -1, np.int32))
    for name in (f.name for f in dataclasses.fields(Segment)):
        getattr(out, name)[at] = np.asarray(getattr(seg, name))[real]
    return out


def run_segment(base, adapters, state: DecodeState, active: np.ndarray, enabled: np.ndarray, budget: np.ndarray, *,
                spec, length: int, gather_rows: int) -> tuple[DecodeState, Segment]:
    """decode_segment of the `active` rows of a batch, gathered when `gather_plan` says so -> (state, the
    whole batch's segment on the host)."""
    rows = gather_plan(active, gather_rows, spec.placement, spec.model.num_layers)
    if rows is None:
        state, seg = decode_segment(base, adapters, state, jnp.asarray(active), jnp.asarray(enabled),
                                    jnp.asarray(budget), spec=spec, length=length)
        return state, jax.device_get(seg)
    b = len(active)
    pick = np.minimum(rows, b - 1)
    state, seg = decode_rows(base, adapters, state, jnp.asarray(rows), jnp.asarray(active[pick] & (rows < b)),
                             jnp.asarray(enabled[pick]), jnp.asarray(budget[pick]), None, None, spec=spec,
                             length=length)
    return state, full_segment(jax.device_get(seg), rows, b)


def run_append(base, adapters, state: DecodeState, obs: np.ndarray, obs_len: np.ndarray, do: np.ndarray, *,
               spec, gather_rows: int) -> tuple[DecodeState, jnp.ndarray | np.ndarray]:
    """sampler.append for the rows of `do`, gathered when `gather_plan` says so -> (state, routes [B, W] of
    the observation positions, −1 in rows not appended)."""
    rows = gather_plan(do, gather_rows, spec.placement, spec.model.num_layers)
    if rows is None:
        return append(base, adapters, state, jnp.asarray(obs), jnp.asarray(obs_len), jnp.asarray(do), spec=spec)
    b = len(do)
    pick = np.minimum(rows, b - 1)
    real = rows < b
    state, routes = append_rows(base, adapters, state, jnp.asarray(rows), jnp.asarray(obs[pick]),
                                jnp.asarray(np.where(real, obs_len[pick], 0)), spec=spec)
    out = np.full(obs.shape, -1, np.int32)
    out[rows[real]] = np.asarray(routes)[real]
    return state, out
