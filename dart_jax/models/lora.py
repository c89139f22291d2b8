"""LoRA adapter trees and the per-token routed delta (the `adapters` / `route_ids` seam).

An adapter is a pytree of trainable `a`/`b` factors per target projection, layer-stacked like the
base (`a: [L, *in_dims, r]`, `b: [L, r, *out_dims]`), plus its scale s = alpha/r as static
metadata (no gradient, no optimizer state). `adapters` is a dict name -> LoraAdapter; route id i
selects the i-th name in sorted order (so {"reasoning", "tool"} gives reasoning = 0, tool = 1),
and −1 selects none. The delta is summed over adapters through `jnp.where`, so on the direct path
a token's gradient reaches only the adapter its route selects. An adapter with an `ffn` method
(MixLoRA's experts, models.mixlora) takes no route id: it replaces the layer's FFN (`ffn_adapter`).
"""

from __future__ import annotations

import math
from typing import Mapping, Sequence

import flax.struct
import jax
import jax.numpy as jnp
import numpy as np

from dart_jax.models import dots
from dart_jax.models.config import ModelConfig

TARGETS = ("q", "k", "v", "o", "gate", "up", "down")
INITS = ("normal", "kaiming_uniform")


@flax.struct.dataclass
class LoraAdapter:
    """params: target -> {"a": [L, *in, r], "b": [L, r, *out]}; scale s = alpha/r (alpha/√r with
    rslora); dropout on the adapter input x (PEFT's lora_dropout) when `dropout_key` holds one
    key per layer (see `with_dropout`)."""

    params: dict
    scale: float = flax.struct.field(pytree_node=False, default=1.0)
    dropout_rate: float = flax.struct.field(pytree_node=False, default=0.0)
    dropout_key: jax.Array | None = None

    @property
    def rank(self) -> int:
        first = next(iter(self.params.values()))
        return int(first["a"].shape[-1])


def io_axes(cfg: ModelConfig, target: str) -> tuple[tuple, tuple, tuple, tuple]:
    """(in_shape, in_axes, out_shape, out_axes) of one target projection (per layer)."""
    D, F, N, K, H = cfg.hidden_size, cfg.intermediate_size, cfg.num_heads, cfg.num_kv_heads, cfg.head_dim
    table = {
        "q": ((D,), ("embed",), (N, H), ("heads", "head_dim")),
        "k": ((D,), ("embed",), (K, H), ("kv_heads", "head_dim")),
        "v": ((D,), ("embed",), (K, H), ("kv_heads", "head_dim")),
        "o": ((N, H), ("heads", "head_dim"), (D,), ("embed",)),
        "gate": ((D,), ("embed",), (F,), ("mlp",)),
        "up": ((D,), ("embed",), (F,), ("mlp",)),
        "down": ((F,), ("mlp",), (D,), ("embed",)),
    }
    if target not in table:
        raise ValueError(f"unknown LoRA target {target!r}; expected some of {TARGETS}")
    return table[target]


def lora_logical_shapes(cfg: ModelConfig, rank: int, targets: Sequence[str] = TARGETS
                        ) -> dict[str, tuple[tuple[int, ...], tuple[str, ...]]]:
    """Flat 'target/a' -> (shape, logical axes). A follows the layer's input-dim sharding, B its
    output dim; the rank axis is replicated."""
    out = {}
    L = cfg.num_layers
    for t in targets:
        in_shape, in_axes, out_shape, out_axes = io_axes(cfg, t)
        out[f"{t}/a"] = ((L, *in_shape, rank), ("layers", *in_axes, "lora_rank"))
        out[f"{t}/b"] = ((L, rank, *out_shape), ("layers", "lora_rank", *out_axes))
    return out


def lora_scale(rank: int, alpha: float, rslora: bool = False) -> float:
    return alpha / math.sqrt(rank) if rslora else alpha / rank


def init_lora(cfg: ModelConfig, key: jax.Array, rank: int, alpha: float,
              targets: Sequence[str] = TARGETS, init: str = "normal", init_std: float = 0.02,
              rslora: bool = False, dropout: float = 0.0, dtype=jnp.float32) -> LoraAdapter:
    """B = 0 (the adapter starts as the identity on the base); A ~ N(0, init_std²) (DART authors)
    or PEFT's kaiming-uniform, A ~ U(±1/√fan_in) (`init="kaiming_uniform"`)."""
    if init not in INITS:
        raise ValueError(f"LoRA init {init!r}; expected one of {INITS}")
    if rank <= 0:
        raise ValueError(f"LoRA rank must be positive, got {rank}")
    params = {}
    shapes = lora_logical_shapes(cfg, rank, targets)
    for i, t in enumerate(targets):
        a_shape, _ = shapes[f"{t}/a"]
        b_shape, _ = shapes[f"{t}/b"]
        k = jax.random.fold_in(key, i)
        fan_in = math.prod(a_shape[1:-1])
        if init == "normal":
            a = init_std * jax.random.normal(k, a_shape, jnp.float32)
        else:
            bound = 1.0 / math.sqrt(fan_in)
            a = jax.random.uniform(k, a_shape, jnp.float32, -bound, bound)
        params[t] = {"a": a.astype(dtype), "b": jnp.zeros(b_shape, dtype)}
    return LoraAdapter(params=params, scale=lora_scale(rank, alpha, rslora), dropout_rate=dropout)


def with_dropout(adapters: Mapping[str, LoraAdapter] | None, key: jax.Array | None
                 ) -> Mapping[str, LoraAdapter] | None:
    """Attach per-layer dropout keys for one training step (no-op when a rate is 0 or key None)."""
    if not adapters or key is None:
        return adapters
    out = dict(adapters)  # MixLoRA experts (models.mixlora) pass through
    for i, name in enumerate(adapter_names(adapters)):
        ad = adapters[name]
        if ad.dropout_rate > 0:
            layers = next(iter(ad.params.values()))["a"].shape[0]
            ad = ad.replace(dropout_key=jax.random.split(jax.random.fold_in(key, i), layers))
        out[name] = ad
    return out


def adapter_names(adapters: Mapping[str, LoraAdapter] | None) -> tuple[str, ...]:
    """Route id i <-> adapter_names(adapters)[i] (the LoRA adapters, sorted; MixLoRA's experts, which
    a gate mixes instead, take no route id)."""
    return tuple(sorted(n for n, a in adapters.items() if isinstance(a, LoraAdapter))) if adapters else ()


def layer_slice(adapters: Mapping[str, LoraAdapter] | None) -> dict | None:
    """The per-layer view used inside the layer loop: every adapter (LoRA and MixLoRA experts) by name."""
    if not adapters:
        return None
    return {name: adapters[name] for name in sorted(adapters)}


def ffn_adapter(layer_adapters: Mapping | None):
    """The adapter among a layer's that replaces its FFN (at most one), else None: an adapter with an
    `ffn(x, p, route_ids) -> (output, statistics)` method (models.mixlora.MixLoraExperts) — the hook
    through which a method supplies the transformer block's FFN."""
    if not layer_adapters:
        return None
    found = [a for a in layer_adapters.values() if callable(getattr(a, "ffn", None))]
    if len(found) > 1:
        raise ValueError("more than one FFN adapter (MixLoRA expert set) among the adapters")
    return found[0] if found else None


def routed_delta(x: jnp.ndarray, layer_adapters: Mapping[str, LoraAdapter] | None, target: str,
                 route_ids: jnp.ndarray | None) -> jnp.ndarray | None:
    """Σ_i [route == i] · s_i · (x A_i) B_i for one layer and one target projection.

    x: [B, T, *in_dims] in compute dtype; layer params a: [*in_dims, r_i], b: [r_i, *out_dims];
    route_ids: i32[B, T]. Returns [B, T, *out_dims] or None when no adapter targets `target`.

    The adapters are stacked along the rank axis (A_cat = [A_0 … A_n], B_cat likewise), so the
    routed pair costs one LoRA of rank Σ r_i: h = x A_cat, then per token `jnp.where` keeps only
    the rank block of the selected adapter (scaled by its s_i), then h B_cat. A zeroed block
    passes no gradient, so on the direct path a token reaches only its own adapter's A and B.
    """
    if not layer_adapters or route_ids is None:
        return None
    routed = adapter_names(layer_adapters)
    names = [n for n in routed if target in layer_adapters[n].params]
    if not names:
        return None
    ids = [routed.index(n) for n in names]
    ads = [layer_adapters[n] for n in names]
    if any(a.dropout_rate > 0 and a.dropout_key is not None for a in ads):
        return _routed_delta_with_dropout(x, ads, ids, target, route_ids)
    a_cat = jnp.concatenate([a.params[target]["a"].astype(x.dtype) for a in ads], axis=-1)
    b_cat = jnp.concatenate([a.params[target]["b"].astype(x.dtype) for a in ads], axis=0)
    ranks = [a.params[target]["a"].shape[-1] for a in ads]
    owner = np.concatenate([np.full(r, i, np.int32) for i, r in zip(ids, ranks)])
    scale = np.concatenate([np.full(r, a.scale, np.float32) for a, r in zip(ads, ranks)])
    keep = route_ids[..., None] == jnp.asarray(owner)                     # [B, T, R]
    gate = jnp.where(keep, jnp.asarray(scale, x.dtype), jnp.zeros((), x.dtype))
    return _masked_lora(x, a_cat, b_cat, gate)


@jax.custom_vjp
def _masked_lora(x: jnp.ndarray, a: jnp.ndarray, b: jnp.ndarray, gate: jnp.ndarray) -> jnp.ndarray:
    """((x A) ⊙ gate) B for x [B, T, *in], a [*in, R], b [R, *out], gate [B, T, R] (0 or s per
    rank column). The backward is written out over [B·T, ·] matrices: autodiff's version
    contracts over the token axes with transposed [B·T, out] cotangents, which XLA:CPU lowers to
    large transposes fused with their producers (+80% on a SmolLM2 MLP backward); this one
    transposes only the rank-sized operands (A's gradient as (ghᵀ x)ᵀ, not xᵀ gh, which transposed
    the [B·T, 1536] input of SmolLM2's down projection: 5.5 → 3.6 ms for that backward at 4 × 512).
    A zero gate column passes no gradient, as with `jnp.where`."""
    return _masked_lora_fwd(x, a, b, gate)[0]


def _flat(x: jnp.ndarray, lead: int) -> jnp.ndarray:
    return x.reshape(math.prod(x.shape[:lead]), -1)


def _masked_lora_fwd(x, a, b, gate):
    n_in = a.ndim - 1
    h = dots.dot(_flat(x, x.ndim - n_in), _flat(a, n_in)) * _flat(gate, 2)            # [N, R]
    y = dots.dot(h, b.reshape(b.shape[0], -1))
    return y.reshape(x.shape[:x.ndim - n_in] + b.shape[1:]), (x, a, b, gate, h)


def _masked_lora_bwd(res, g):
    x, a, b, gate, h = res
    n_in = a.ndim - 1
    lead = x.ndim - n_in
    g2 = _flat(g, lead)                                                                 # [N, O]
    b2 = b.reshape(b.shape[0], -1)                                                      # [R, O]
    a2 = _flat(a, n_in)                                                                 # [I, R]
    x2 = _flat(x, lead)                                                                 # [N, I]
    gb = dots.dot(jax.lax.optimization_barrier(h.T), g2).reshape(b.shape)
    gh = dots.dot(g2, b2.T) * _flat(gate, 2)                                             # [N, R]
    ga = jax.lax.optimization_barrier(dots.dot(gh.T, x2)).T.reshape(a.shape)             # (ghᵀ x)ᵀ: x not transposed
    gx = dots.dot(gh, a2.T).reshape(x.shape)
    return gx, ga, gb, jnp.zeros_like(gate)


_masked_lora.defvjp(_masked_lora_fwd, _masked_lora_bwd)


def _routed_delta_with_dropout(x, ads, ids, target, route_ids):
    """Per-adapter path: each adapter drops its own input units (PEFT's lora_dropout)."""
    total = None
    for i, adapter in zip(ids, ads):
        a = adapter.params[target]["a"].astype(x.dtype)
        b = adapter.params[target]["b"].astype(x.dtype)
        xin = x
        if adapter.dropout_rate > 0 and adapter.dropout_key is not None:
            keep = 1.0 - adapter.dropout_rate
            k = jax.random.fold_in(adapter.dropout_key, TARGETS.index(target))
            mask = jax.random.bernoulli(k, keep, x.shape)
            xin = jnp.where(mask, x / keep, jnp.zeros((), x.dtype))
        d = jnp.tensordot(jnp.tensordot(xin, a, axes=a.ndim - 1), b, axes=1) * jnp.asarray(adapter.scale, x.dtype)
        sel = (route_ids == i).reshape(route_ids.shape + (1,) * (d.ndim - 2))
        d = jnp.where(sel, d, jnp.zeros((), d.dtype))
        total = d if total is None else total + d
    return total
