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
    """-> (train state, base), both sharded by the logical rules. The full variant trains fp32 masters
    of the base (`init_state`), so the original stays the frozen reference policy in its own dtype.
    Memory: masters + AdamW moments = 12 bytes per trainable parameter (`state_bytes_per_device`)."""
    base = jax.device_put(base, base_shardings(cfg, mesh))
    params = trainable(method, base, adapters)
    if method.trains_base:  # a copy: an fp32 base would otherwise be its own master, donated by the step
        params = jax.tree.map(jnp.copy, params)
    else:
        params = jax.device_put(params, adapter_shardings(params, cfg, mesh))
    return init_on_mesh(params, optimizer, mesh), base


def init_on_mesh(params, optimizer: optax.GradientTransformation, mesh: Mesh) -> TrainState:
    """`init_state` of already placed params, the state sharded as `state_shardings` says."""
    init = lambda p: init_state(p, optimizer)  # noqa: E731
    sh = state_shardings(optimizer, jax.eval_shape(init, params), jax.tree.map(lambda x: x.sharding, params), mesh)
    return jax.jit(init, out_shardings=sh)(params)


def state_shardings(optimizer: optax.GradientTransformation, abstract: TrainState, param_sh, mesh: Mesh):
    """Masters and every optimiser tree shaped like the parameters (Adam's moments) sharded as the
    parameters; counters replicated. Explicit, so the moments never land replicated by propagation."""
    rep = NamedSharding(mesh, P())
    opt_sh = optax.tree_utils.tree_map_params(optimizer, lambda _, s: s, abstract.opt_state, param_sh,
                                              transform_non_params=lambda _: rep)
    return TrainState(param_sh, opt_sh, rep, rep, abstract.compute_dtypes)


def state_bytes_per_device(state: TrainState) -> int:
    """Bytes one device holds of the train state (fp32 masters + AdamW moments + counters): the
    largest shard of each leaf, summed."""
    return sum(max(s.data.nbytes for s in x.addressable_shards) for x in jax.tree.leaves(state))


def microbatch_sharding(shape: tuple[int, ...], mesh: Mesh) -> NamedSharding:
    """[M, b, T] token arrays and [M, b] per-row arrays: rows over (data, fsdp)."""
    return named_sharding((None, "batch", "length")[:len(shape)], shape, mesh)


def jit_step(step: Callable, state: TrainState, base, batch_shapes: dict[str, tuple[int, ...]], mesh: Mesh):
    """`step(state, base, batch, key, rl_step)` jitted with explicit in/out shardings and the state donated."""
    rep = NamedSharding(mesh, P())
    state_sh = jax.tree.map(lambda x: x.sharding, state)
    base_sh = jax.tree.map(lambda x: x.sharding, base)
    batch_sh = {k: microbatch_sharding(s, mesh) for k, s in batch_shapes.items()}
    return jax.jit(step, in_shardings=(state_sh, base_sh, batch_sh, rep, rep), out_shardings=(state_sh, rep),
                   donate_argnums=(0,))
