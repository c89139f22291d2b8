"""Where the sampler's arrays live on the run's mesh (rollouts on the mesh).

`RolloutMesh` is a static part of the sampler's spec. Every jitted sampler function (prefill, decode
segment, append, cache growth) pins its decode state to it on the way in and on the way out, so the
compiled programs have explicit shardings at their boundaries and XLA cannot drift into another
layout between calls (the state is donated and updated in place at the same sharding):

    KV cache k  [B, K, H, S]   batch over (data, fsdp), KV heads over tensor where divisible
    KV cache v  [B, K, S, H]   the same
    cache pos   [B, S]         batch over (data, fsdp)
    per-row vectors, keys      batch over (data, fsdp)

A dimension that does not divide its mesh axes is replicated (parallel.mesh.logical_to_spec), so
a batch of 6 on 4 data shards or SmolLM2's 3 KV heads on 2 tensor shards still run. The model
weights keep the training layout (models.sharding: embed over fsdp, heads and MLP over tensor).

The decode layout (`decode_params`, config `rollout.decode_layout`): the decode loop runs the
layers unrolled, and on XLA:CPU a weight sliced out of the stacked [L, ...] tree inside the loop is
copied at every step.
    per_layer  (default) the sampler reads a per-layer copy of the weights: one more copy of the
               layer weights and, for tied embeddings, a [D, V] head, each sharded as its source
               (on an n-way fsdp × tensor mesh the copy costs 1/n of the weights per device).
    stacked    no resident copy: the loop reads static slices of the training tree. XLA may still
               materialise the slices as temporaries of the decode program (XLA:CPU does: measured
               in `launch.sweep --rollout`).
    shared     the run holds its frozen base per layer (models.transformer.unstack_layers) and
               training and rollouts read that one tree: no copy, no slices. The training forward
               then runs its layers as a Python loop instead of a scan (longer compiles, the same
               math), and the tied head is read as the transposed embedding.
"""

from __future__ import annotations

import dataclasses
import functools
import logging
from typing import Any

import jax
from jax.sharding import Mesh, NamedSharding, PartitionSpec as P

from dart_jax.models.cache import KVCache, init_cache
from dart_jax.models.config import ModelConfig
from dart_jax.parallel.mesh import DEFAULT_RULES, named_sharding

log = logging.getLogger(__name__)
_WARNED: list = []
DECODE_LAYOUTS = ("per_layer", "stacked", "shared")
CACHE_AXES = {"k": ("batch", "kv_heads", "head_dim", "cache_length"),
              "v": ("batch", "kv_heads", "cache_length", "head_dim"),
              "pos": ("batch", "cache_length")}


@dataclasses.dataclass(frozen=True)
class RolloutMesh:
    """The mesh and logical rules the sampler's state is placed by (hashable: a jit static)."""

    mesh: Mesh
    rules: tuple[tuple[str, Any], ...] = tuple(DEFAULT_RULES.items())

    @classmethod
    def of(cls, mesh: Mesh | None, rules=None) -> "RolloutMesh | None":
        if mesh is None:
            return None
        return cls(mesh, tuple((rules or DEFAULT_RULES).items()))

    def _named(self, axes, shape) -> NamedSharding:
        return named_sharding(axes, shape, self.mesh, dict(self.rules))

    def rows(self, shape) -> NamedSharding:
        """A per-row array [B, ...]: batch over (data, fsdp), the rest replicated."""
        return self._named(("batch",) + (None,) * (len(shape) - 1), shape)

    def cache(self, cfg: ModelConfig, batch: int, capacity: int) -> KVCache:
        k, h = cfg.num_kv_heads, cfg.head_dim
        ks = self._named(CACHE_AXES["k"], (batch, k, h, capacity))
        vs = self._named(CACHE_AXES["v"], (batch, k, capacity, h))
        return KVCache(k=(ks,) * cfg.num_layers, v=(vs,) * cfg.num_layers,
                       pos=self._named(CACHE_AXES["pos"], (batch, capacity)),
                       index=NamedSharding(self.mesh, P()))

    def cache_like(self, cache: KVCache) -> KVCache:
        """Shardings for a (possibly traced) cache, from its shapes."""
        def leaf(a, axes):
            return self._named(axes, a.shape)
        return KVCache(k=tuple(leaf(a, CACHE_AXES["k"]) for a in cache["k"]),
                       v=tuple(leaf(a, CACHE_AXES["v"]) for a in cache["v"]),
                       pos=leaf(cache["pos"], CACHE_AXES["pos"]), index=NamedSharding(self.mesh, P()))

    def constrain(self, tree):
        """Pin a DecodeState (or a Segment, or any tree of per-row arrays whose caches are KVCache
        dicts) to this placement inside a jitted function."""
        def place(x):
            if isinstance(x, dict) and set(x) == {"k", "v", "pos", "index"}:
                return jax.lax.with_sharding_constraint(x, self.cache_like(x))
            if hasattr(x, "shape") and x.ndim >= 1:
                return jax.lax.with_sharding_constraint(x, self.rows(x.shape))
            return x
        is_cache = lambda x: isinstance(x, dict) and set(x) == {"k", "v", "pos", "index"}  # noqa: E731
        return jax.tree.map(place, tree, is_leaf=is_cache)


def constrain(tree, placement: RolloutMesh | None):
    return tree if placement is None else placement.constrain(tree)


@functools.lru_cache(maxsize=32)
def _cache_maker(cfg: ModelConfig, batch: int, capacity: int, placement: RolloutMesh):
    return jax.jit(lambda: init_cache(cfg, batch, capacity), out_shardings=placement.cache(cfg, batch, capacity))


def new_cache(cfg: ModelConfig, batch: int, capacity: int, placement: RolloutMesh | None) -> KVCache:
    """An empty KV cache, created sharded on the placement's mesh (each device allocates only its
    shard) or on the default device without one."""
    if placement is None:
        return init_cache(cfg, batch, capacity)
    return _cache_maker(cfg, batch, capacity, placement)()


def decode_params(base: dict, layout: str = "per_layer") -> dict:
    """The base as the decode loop reads it (module doc): `per_layer` (a memoised, sharded per-layer
    copy: models.transformer.per_layer_params), `stacked` (the training tree itself) or `shared` (the
    tree, already per layer when its owner unstacked it; a stacked one gets the memoised copy)."""
    from dart_jax.models.transformer import per_layer_params
    if layout not in DECODE_LAYOUTS:
        raise ValueError(f"rollout.decode_layout={layout!r}; expected one of {DECODE_LAYOUTS}")
    if layout == "stacked":
        return base
    if layout == "shared" and not isinstance(base["layers"], (list, tuple)) and not _WARNED:
        _WARNED.append(True)
        log.warning("rollout.decode_layout='shared' but this base is held stacked (its owner did not unstack "
                    "it: a trained base is per step): decoding from a per-layer copy")
    return per_layer_params(base)
