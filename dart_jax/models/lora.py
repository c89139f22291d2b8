"""LoRA adapter trees and the per-token routed delta (the `adapters` / `route_ids` seam).

An adapter is a pytree of trainable `a`/`b` factors per target projection, layer-stacked like the
base (`a: [L, *in_dims, r]`, `b: [L, r, *out_dims]`), plus its scale s = alpha/r as static
metadata (no gradient, no optimizer state). `adapters` is a dict name -> LoraAdapter; route id i
selects the i-th name in sorted order (so {"reasoning", "tool"} gives reasoning = 0, tool = 1),
and −1 selects none. The delta is summed over adapters through `jnp.where`, so on the direct path
a token's gradient reaches only the adapter its route selects.
"""

from __future__ import annotations

from typing import Mapping

import flax.struct
import jax.numpy as jnp

TARGETS = ("q", "k", "v", "o", "gate", "up", "down")


@flax.struct.dataclass
class LoraAdapter:
    params: dict  # target -> {"a": [L, *in, r], "b": [L, r, *out]}
    scale: float = flax.struct.field(pytree_node=False, default=1.0)


def adapter_names(adapters: Mapping[str, LoraAdapter] | None) -> tuple[str, ...]:
    """Route id i <-> adapter_names(adapters)[i]."""
    return tuple(sorted(adapters)) if adapters else ()


def layer_slice(adapters: Mapping[str, LoraAdapter] | None) -> dict | None:
    """The per-layer view used inside the layer loop: name -> (params, scale)."""
    if not adapters:
        return None
    return {name: adapters[name] for name in adapter_names(adapters)}


def routed_delta(x: jnp.ndarray, layer_adapters: Mapping[str, LoraAdapter] | None, target: str,
                 route_ids: jnp.ndarray | None) -> jnp.ndarray | None:
    """Σ_i [route == i] · s_i · (x A_i) B_i for one layer and one target projection.

    x: [B, T, *in_dims] in compute dtype; layer params a: [*in_dims, r], b: [r, *out_dims];
    route_ids: i32[B, T]. Returns [B, T, *out_dims] or None when no adapter targets `target`.
    """
    if not layer_adapters or route_ids is None:
        return None
    total = None
    for i, name in enumerate(sorted(layer_adapters)):
        adapter = layer_adapters[name]
        if target not in adapter.params:
            continue
        a = adapter.params[target]["a"].astype(x.dtype)
        b = adapter.params[target]["b"].astype(x.dtype)
        h = jnp.tensordot(x, a, axes=a.ndim - 1)
        d = jnp.tensordot(h, b, axes=1) * jnp.asarray(adapter.scale, x.dtype)
        sel = (route_ids == i).reshape(route_ids.shape + (1,) * (d.ndim - 2))
        d = jnp.where(sel, d, jnp.zeros((), d.dtype))
        total = d if total is None else total + d
    return total
