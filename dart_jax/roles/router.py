"""The role router ψ: one pure function of token ids -> each position's role.

Roles: REASONING = 0, TOOL = 1 (PAD_ROLE = −1 on padding when a validity mask is given).

Convention "dart_jax" (default): the forward pass at position i uses the tool adapter iff the tag
span is open *after consuming token i*. Position i's logits predict token i+1, so every token
inside the span, the closing tag included, is predicted by the tool adapter, and the loss role of
token t is the route of position t−1 (`loss_roles`).

Convention "authors" (the DART authors' training code): positions p_open+1 … p_close are tool,
i.e. the route of position i is the state *before* consuming token i (our routes shifted right by
one). Kept for cross-checking against their PyTorch code.

Malformed input, deterministically: an opening tag while open keeps the span open (no nesting
depth); a closing tag while closed does nothing; an unterminated span stays open to the end.
Several (open, close) pairs may be configured; any opening id opens and any closing id closes.
"""

from __future__ import annotations

import dataclasses
from typing import Sequence

import jax
import jax.numpy as jnp

REASONING = 0
TOOL = 1
PAD_ROLE = -1
CONVENTIONS = ("dart_jax", "authors")


@dataclasses.dataclass(frozen=True)
class RouterSpec:
    open_ids: tuple[int, ...]
    close_ids: tuple[int, ...]
    convention: str = "dart_jax"

    def __post_init__(self):
        if self.convention not in CONVENTIONS:
            raise ValueError(f"router convention {self.convention!r}; expected one of {CONVENTIONS}")
        if not self.open_ids or not self.close_ids:
            raise ValueError("router needs at least one opening and one closing tag id")
        if set(self.open_ids) & set(self.close_ids):
            raise ValueError(f"tag ids used both to open and to close: {set(self.open_ids) & set(self.close_ids)}")


def _isin(tokens, ids: Sequence[int]):
    out = jnp.zeros(tokens.shape, bool)
    for i in ids:
        out = out | (tokens == i)
    return out


def route_roles(tokens: jnp.ndarray, spec: RouterSpec, valid: jnp.ndarray | None = None) -> jnp.ndarray:
    """tokens: i32[B, T] -> roles i32[B, T] (batch form, no scan).

    open_after[i] = (last opening index ≤ i) > (last closing index ≤ i): a running max of event
    indices, so a whole batch is two cummax ops."""
    t = tokens.shape[-1]
    idx = jnp.arange(t, dtype=jnp.int32)
    opens = jnp.where(_isin(tokens, spec.open_ids), idx, -1)
    closes = jnp.where(_isin(tokens, spec.close_ids), idx, -1)
    last_open = _cummax(opens)
    last_close = _cummax(closes)
    open_after = last_open > last_close
    if spec.convention == "authors":
        open_after = jnp.concatenate([jnp.zeros_like(open_after[..., :1]), open_after[..., :-1]], axis=-1)
    roles = jnp.where(open_after, TOOL, REASONING).astype(jnp.int32)
    if valid is not None:
        roles = jnp.where(valid, roles, PAD_ROLE)
    return roles


def _cummax(x: jnp.ndarray) -> jnp.ndarray:
    return jax.lax.cummax(x, axis=x.ndim - 1)


def init_state(batch: int) -> jnp.ndarray:
    """Incremental router state: bool[B], True while a span is open."""
    return jnp.zeros((batch,), bool)


def route_step(state: jnp.ndarray, token: jnp.ndarray, spec: RouterSpec) -> tuple[jnp.ndarray, jnp.ndarray]:
    """(state bool[B], token i32[B]) -> (new state, role i32[B] of the position holding `token`).
    Used inside the decode loop: the role routes the forward pass that consumes `token`."""
    opened = _isin(token, spec.open_ids)
    closed = _isin(token, spec.close_ids)
    new_state = jnp.where(opened, True, jnp.where(closed, False, state))
    routed = new_state if spec.convention == "dart_jax" else state
    return new_state, jnp.where(routed, TOOL, REASONING).astype(jnp.int32)


def state_after(tokens: jnp.ndarray, spec: RouterSpec) -> jnp.ndarray:
    """Router state after consuming all of `tokens` [B, T] (to resume decoding after a prefill)."""
    opens = jnp.where(_isin(tokens, spec.open_ids), jnp.arange(tokens.shape[-1]), -1).max(-1)
    closes = jnp.where(_isin(tokens, spec.close_ids), jnp.arange(tokens.shape[-1]), -1).max(-1)
    return opens > closes


def loss_roles(roles: jnp.ndarray) -> jnp.ndarray:
    """Role of token t = route of position t−1 (the position whose logits predict it); token 0
    has no predicting position and gets PAD_ROLE."""
    return jnp.concatenate([jnp.full_like(roles[..., :1], PAD_ROLE), roles[..., :-1]], axis=-1)
