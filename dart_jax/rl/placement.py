"""Placing a train state on a mesh and jitting the update with explicit shardings — shared by the
trainer and the mesh sweep so both measure and run the same sharded program."""

from __future__ import annotations

from typing import Any, Callable

import jax
import jax.numpy as jnp
import optax
from jax.sharding import Mesh, NamedSharding, PartitionSpec as P

from dart_jax.adapters.method import MethodSpec, trainable
from dart_jax.models.config import ModelConfig
from dart_jax.models.sharding import adapter_shardings, base_shardings
from dart_jax.parallel.mesh import named_sharding
from dart_jax.rl.step import TrainState, init_state


def place_state(method: MethodSpec, cfg: ModelConfig, base, adapters, optimizer: optax.GradientTransformation,
                mesh: Mesh) -> tuple[TrainState, Any]:
    """-> (train state, base), both sharded by the logical rules. The full variant trains a copy of
    the base, so the original stays the frozen reference policy."""
    base = jax.device_put(base, base_shardings(cfg, mesh))
    params = trainable(method, base, adapters)
    if method.trains_base:
        params = jax.device_put(jax.tree.map(jnp.copy, params), base_shardings(cfg, mesh))
    else:
        params = jax.device_put(params, adapter_shardings(params, cfg, mesh))
    return jax.jit(lambda p: init_state(p, optimizer))(params), base


def microbatch_sharding(shape: tuple[int, ...], mesh: Mesh) -> NamedSharding:
    """[M, b, T] token arrays and [M, b] per-row arrays: rows over (data, fsdp)."""
    return named_sharding((None, "batch", "length")[:len(shape)], shape, mesh)


def jit_step(step: Callable, state: TrainState, base, batch_shapes: dict[str, tuple[int, ...]], mesh: Mesh):
    """`step(state, base, batch, key)` jitted with explicit in/out shardings and the state donated."""
    rep = NamedSharding(mesh, P())
    state_sh = jax.tree.map(lambda x: x.sharding, state)
    base_sh = jax.tree.map(lambda x: x.sharding, base)
    batch_sh = {k: microbatch_sharding(s, mesh) for k, s in batch_shapes.items()}
    return jax.jit(step, in_shardings=(state_sh, base_sh, batch_sh, rep), out_shardings=(state_sh, rep),
                   donate_argnums=(0,))
