"""Materialise the base tree from a TensorSource straight into (sharded) device arrays.

Each leaf is built with `jax.make_array_from_callback`: for every device shard the callback slices
only the needed part out of the source (an mmap view for safetensors), applies the leaf's View and
casts to the param dtype. Nothing passes through torch.
"""

from __future__ import annotations

from typing import Mapping

import jax
import numpy as np
from jax.sharding import Sharding, SingleDeviceSharding

from dart_jax.checkpoints.sources import TensorSource, iter_leaf_names, views
from dart_jax.models.config import ModelConfig
from dart_jax.models.transformer import Params, param_shapes, unflatten


class CheckpointMismatch(ValueError):
    """A tensor is missing, extra or misshaped; the message names each one."""


def validate(source: TensorSource, cfg: ModelConfig) -> None:
    shapes = param_shapes(cfg)
    vs = views(cfg)
    expected: dict[str, tuple[int, ...]] = {}
    for path, _layer, name in iter_leaf_names(source, cfg, shapes):
        expected[name] = vs[path].raw
    present = source.names()
    missing = sorted(set(expected) - present)
    extra = sorted(n for n in present - set(expected) if not source.ignorable(n, cfg))
    misshaped = [f"{n}: file has {source.shape(n)}, expected {expected[n]}"
                 for n in sorted(set(expected) & present) if source.shape(n) != expected[n]]
    problems = []
    if missing:
        problems.append(f"missing tensors: {missing[:8]}{' …' if len(missing) > 8 else ''} ({len(missing)})")
    if extra:
        problems.append(f"unexpected tensors: {extra[:8]}{' …' if len(extra) > 8 else ''} ({len(extra)})")
    if misshaped:
        problems.append("misshaped tensors: " + "; ".join(misshaped[:8]))
    if problems:
        raise CheckpointMismatch(f"{source.origin} does not match the {cfg.model_type} config: "
                                 + " | ".join(problems))


def load_base(source: TensorSource, cfg: ModelConfig,
              shardings: Mapping[str, Sharding] | None = None) -> Params:
    """shardings: flat {path: Sharding}; None places every leaf on the first device."""
    validate(source, cfg)
    vs = views(cfg)
    dtype = cfg.weight_dtype
    default = SingleDeviceSharding(jax.devices()[0])
    flat = {}
    for path, (shape, _axes) in param_shapes(cfg).items():
        view = vs[path]
        stacked = path.startswith("layers/")
        leaf = path.split("/", 1)[1] if stacked else path

        def callback(index, view=view, leaf=leaf, stacked=stacked, shape=shape):
            index = tuple(index) + (slice(None),) * (len(shape) - len(index))
            if not stacked:
                return np.ascontiguousarray(view.apply_indexed(source.get(source.name(leaf, None)), index), dtype=dtype)
            layers = range(*index[0].indices(shape[0]))
            return np.stack([np.asarray(view.apply_indexed(source.get(source.name(leaf, layer)), index[1:]),
                                        dtype=dtype)
                             for layer in layers])

        sharding = (shardings or {}).get(path, default)
        flat[path] = jax.make_array_from_callback(shape, sharding, callback)
        source.release()
    return unflatten(flat)
