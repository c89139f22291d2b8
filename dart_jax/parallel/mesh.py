"""Device mesh and logical-axis sharding rules.

Mesh axes are ("data", "fsdp", "tensor"). We use classic GSPMD propagation (AxisType.Auto on
every axis): params and batches are placed with NamedSharding and jitted functions get explicit
in/out shardings, XLA propagates the rest. (jax's default Explicit axis types would require a
sharding on every intermediate; we decided against mixing the two.)

Logical rules are data: each logical axis name maps to a mesh axis, a tuple of mesh axes, or None
(replicated). A dimension whose size is not divisible by its mesh axes is replicated instead, so
models with awkward head counts (SmolLM2: 9 heads, 3 KV heads) still shard everything else.
"""

from __future__ import annotations

import logging
import math
from collections import Counter
from typing import Mapping, Sequence

import jax
from jax.sharding import AxisType, Mesh, NamedSharding, PartitionSpec as P

MESH_AXES = ("data", "fsdp", "tensor")

LogicalRules = Mapping[str, str | tuple[str, ...] | None]

DEFAULT_RULES: dict[str, str | tuple[str, ...] | None] = {
    "batch": ("data", "fsdp"),
    "length": None,
    "embed": "fsdp",
    "vocab": "tensor",
    "heads": "tensor",
    "kv_heads": "tensor",
    "head_dim": None,
    "mlp": "tensor",
    "layers": None,
    "norm": None,
    "lora_rank": None,
    "experts": None,
    "cache_length": None,
}

log = logging.getLogger(__name__)


def make_mesh(shape: Sequence[int], devices: Sequence[jax.Device] | None = None) -> Mesh:
    """A ("data", "fsdp", "tensor") mesh; the product of `shape` must equal the device count. Devices
    in several slices (TPU multi-slice, multi-node GPU jobs whose devices report `slice_index`) get
    the hybrid layout: data across slices (DCN), fsdp and tensor inside one (`hybrid_devices`)."""
    shape = tuple(int(s) for s in shape)
    if len(shape) != 3:
        raise ValueError(f"mesh shape {shape} must have 3 entries (data, fsdp, tensor)")
    devices = list(devices if devices is not None else jax.devices())
    if math.prod(shape) != len(devices):
        raise ValueError(f"mesh shape {shape} needs {math.prod(shape)} devices; "
                         f"{len(devices)} available")
    if num_slices(devices) > 1:
        return Mesh(hybrid_devices(shape, devices), MESH_AXES, axis_types=(AxisType.Auto,) * 3)
    return jax.make_mesh(shape, MESH_AXES, axis_types=(AxisType.Auto,) * 3, devices=devices)


def num_slices(devices: Sequence) -> int:
    return len({getattr(d, "slice_index", 0) for d in devices})


def hybrid_devices(shape: tuple[int, int, int], devices: Sequence):
    """The device grid of a multi-slice mesh: the data axis split over the slices (data-parallel
    traffic crosses the slow DCN link once per step), fsdp and tensor within each slice (their
    collectives run every layer and need ICI / NVLink)."""
    from jax.experimental import mesh_utils
    n = num_slices(devices)
    if shape[0] % n:
        raise ValueError(f"mesh shape {shape}: the data axis ({shape[0]}) must be a multiple of the {n} slices "
                         "(data runs across slices; fsdp and tensor within one)")
    return mesh_utils.create_hybrid_device_mesh((shape[0] // n, shape[1], shape[2]), (n, 1, 1), devices,
                                                allow_split_physical_axes=True)


def logical_to_spec(axes: Sequence[str | None], shape: Sequence[int], mesh: Mesh,
                    rules: LogicalRules = DEFAULT_RULES, notes: list[str] | None = None) -> P:
    """PartitionSpec for a leaf with logical `axes`; indivisible dims and reused mesh axes are
    replicated. Each indivisible dim is noted: logged, or appended to `notes` (tree_shardings sums
    a tree's notes up in one line instead of one per leaf)."""
    used: set[str] = set()
    spec = []
    for name, dim in zip(axes, shape):
        target = rules.get(name) if name is not None else None
        if name is not None and name not in rules:
            raise KeyError(f"logical axis {name!r} has no sharding rule")
        mesh_axes = (target,) if isinstance(target, str) else tuple(target or ())
        mesh_axes = tuple(a for a in mesh_axes if mesh.shape[a] > 1 and a not in used)
        size = math.prod(mesh.shape[a] for a in mesh_axes)
        if mesh_axes and dim % size:
            note = f"{name}={dim} over {'×'.join(mesh_axes)}={size}"
            if notes is None:
                log.info("replicating dim %s (not divisible)", note)
            else:
                notes.append(note)
            mesh_axes = ()
        used.update(mesh_axes)
        spec.append(mesh_axes[0] if len(mesh_axes) == 1 else (mesh_axes or None))
    return P(*spec)


def named_sharding(axes, shape, mesh: Mesh, rules: LogicalRules = DEFAULT_RULES) -> NamedSharding:
    return NamedSharding(mesh, logical_to_spec(axes, shape, mesh, rules))


def tree_shardings(logical: Mapping[str, tuple[tuple[int, ...], tuple]], mesh: Mesh,
                   rules: LogicalRules = DEFAULT_RULES) -> dict[str, NamedSharding]:
    """Flat {path: (shape, axes)} -> flat {path: NamedSharding}; the dims replicated because they do
    not divide their mesh axes are logged in one line for the whole tree."""
    notes: list[str] = []
    out = {path: NamedSharding(mesh, logical_to_spec(axes, shape, mesh, rules, notes))
           for path, (shape, axes) in logical.items()}
    if notes:
        counts = Counter(notes)
        log.info("replicated, not divisible by their mesh axes: %s",
                 ", ".join(f"{n} ({k} leaves)" if k > 1 else n for n, k in counts.items()))
    return out
