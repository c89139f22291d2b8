"""Multi-process (multi-host) runs: start jax's distributed runtime, and the few collectives the
host-side loop needs.

    initialize(coordinator, num_processes, process_id)   explicit (--coordinator, --num-processes,
                                                          --process-id on launch.train)
    initialize(auto=True)                                 jax's own cluster detection (--distributed:
                                                          SLURM, Open MPI, Cloud TPU pods via their
                                                          metadata server)
    initialize()                                          the same, when the environment looks like a
                                                          SLURM job step with > 1 task, an Open MPI
                                                          job with > 1 rank or a GKE TPU pod

SLURM notes: jax's SLURM detection restricts each process to the GPU numbered by its local task id
(one task per GPU, one local device per process). For one process per node (`--ntasks-per-node=1`)
set JAX_LOCAL_DEVICE_IDS=0,1,…,7 so each process keeps all its node's GPUs (launch/slurm/
train.sbatch does). A multi-node GPU job is multi-slice when the devices report a `slice_index`:
`parallel.mesh.make_mesh` then lays the data axis over slices (DCN) and fsdp / tensor inside a
slice (ICI / NVLink).

On CPU (tests: N processes × M forced host devices on localhost) collectives go through gloo.

The training loop's contract (rl.trainer): every process runs the same host loop on the same data
stream; each rolls out its contiguous share of a step's prompts (whole GRPO groups) on its own
local devices with its own tool instances; the trajectories are all-gathered on the host
(`allgather_objects`, pickled: every process then holds the step's whole batch, identical everywhere), and
the update runs on the global mesh; metrics, plots and files are written by process 0 and orbax
checkpoints by all.
"""

from __future__ import annotations

import logging
import os
import pickle
from typing import Any

import jax
import numpy as np

log = logging.getLogger(__name__)

_STARTED: list = []


def cluster_detected() -> str | None:
    """The multi-process launcher this environment looks like (None for a single process)."""
    env = os.environ
    if int(env.get("SLURM_NTASKS", env.get("SLURM_NPROCS", "1")) or 1) > 1 and "SLURM_STEP_ID" in env:
        return "slurm"
    if int(env.get("OMPI_COMM_WORLD_SIZE", "1") or 1) > 1 and "OMPI_MCA_orte_hnp_uri" in env:
        return "openmpi"  # what jax's Open MPI detection reads (Open MPI 5 does not set it: use --coordinator)
    hosts = env.get("TPU_WORKER_HOSTNAMES", "")
    if hosts and len(hosts.split(",")) > 1:
        return "tpu"
    return None


def initialize(coordinator: str = "", num_processes: int = 0, process_id: int = -1,
               local_device_ids: list[int] | None = None, auto: bool = False) -> bool:
    """Start the distributed runtime once: with explicit arguments, with jax's own detection (`auto`),
    or when `cluster_detected()`. -> whether this is a multi-process run. Must run before anything
    touches a jax backend."""
    if _STARTED:
        return jax.process_count() > 1
    if num_processes == 1 and process_id in (-1, 0) and not coordinator:
        return False  # one process, said explicitly
    explicit = bool(coordinator) or num_processes > 1 or process_id >= 0
    cluster = "auto" if auto else cluster_detected()
    if not explicit and cluster is None:
        return False
    if explicit and not (coordinator and num_processes > 1 and process_id >= 0):
        raise ValueError("a multi-process run needs --coordinator=HOST:PORT, --num-processes=N (> 1) and "
                         f"--process-id=I together; got {coordinator!r}, {num_processes}, {process_id}")
    if explicit and not 0 <= process_id < num_processes:
        raise ValueError(f"--process-id={process_id} must be in [0, {num_processes})")
    try:  # CPU processes talk through gloo (no effect on GPU / TPU backends)
        jax.config.update("jax_cpu_collectives_implementation", "gloo")
    except (AttributeError, ValueError) as e:  # renamed or removed in a later jax
        log.warning("could not select gloo CPU collectives (%s)", e)
    kwargs: dict[str, Any] = {}
    if explicit:
        kwargs = dict(coordinator_address=coordinator, num_processes=num_processes, process_id=process_id)
    if local_device_ids is not None:
        kwargs["local_device_ids"] = local_device_ids
    jax.distributed.initialize(**kwargs)
    _STARTED.append(True)
    log.info("distributed: process %d of %d (%s), %d local / %d global devices", jax.process_index(),
             jax.process_count(), cluster or "explicit", jax.local_device_count(), jax.device_count())
    return jax.process_count() > 1


def is_main() -> bool:
    return jax.process_index() == 0


def barrier(name: str) -> None:
    if jax.process_count() > 1:
        from jax.experimental import multihost_utils
        multihost_utils.sync_global_devices(name)


def allgather_objects(obj: Any) -> list[Any]:
    """Every process's `obj` (any picklable value: our own processes, trusted), in process order,
    on every process."""
    if jax.process_count() == 1:
        return [obj]
    from jax.experimental import multihost_utils
    data = np.frombuffer(pickle.dumps(obj, protocol=pickle.HIGHEST_PROTOCOL), np.uint8)
    sizes = multihost_utils.process_allgather(np.asarray([data.size], np.int64)).reshape(-1)
    buf = np.zeros(int(sizes.max()), np.uint8)
    buf[:data.size] = data
    allb = multihost_utils.process_allgather(buf).reshape(len(sizes), -1)
    return [pickle.loads(allb[i, :sizes[i]].tobytes()) for i in range(len(sizes))]


def on_main(fn, *args, **kwargs):
    """Run fn on process 0 only; every process returns its result or raises its error (so a failure
    on process 0 never leaves the others waiting at the next collective)."""
    out, err = None, None
    if is_main():
        try:
            out = fn(*args, **kwargs)
        except Exception as e:  # re-raised below, on every process
            err = e
    got = allgather_objects(None if err is None else f"{type(err).__name__}: {err}")[0]
    if err is not None:
        raise err
    if got is not None:
        raise RuntimeError(f"process 0 failed: {got}")
    return out


def from_main(fn, *args, **kwargs):
    """fn's result on process 0, returned on every process (decisions read from files — is a stage
    done, what an earlier run sampled — made once, so no process races another's writes)."""
    out = on_main(fn, *args, **kwargs)
    if jax.process_count() == 1:
        return out
    return allgather_objects(out if is_main() else None)[0]


class _Failed:
    def __init__(self, what: str):
        self.what = what


def gather_results(fn, *args, **kwargs) -> list:
    """fn's result on every process, in process order, on every process; a process whose fn raises
    makes every process raise (no process is left waiting at the gather)."""
    if jax.process_count() == 1:
        return [fn(*args, **kwargs)]
    try:
        out = fn(*args, **kwargs)
    except Exception as e:  # re-raised below, on every process
        err = e
        out = _Failed(f"{type(e).__name__}: {e}")
    else:
        err = None
    parts = allgather_objects(out)
    failed = [(i, p.what) for i, p in enumerate(parts) if isinstance(p, _Failed)]
    if err is not None:
        raise err
    if failed:
        raise RuntimeError(f"process {failed[0][0]} failed: {failed[0][1]}")
    return parts


def rounds(items: list) -> list[list]:
    """`items` in rounds of process_count: item k of a round is process k's (work split round-robin
    across processes; their results, gathered in process order, come back in item order). A process
    without an item in the last round only takes part in its gather."""
    n = jax.process_count()
    return [items[i:i + n] for i in range(0, len(items), n)]


def mine(round_: list):
    """This process's item of a round, or None."""
    pid = jax.process_index()
    return round_[pid] if pid < len(round_) else None


def host_tree(tree):
    """The tree's arrays as host numpy on every process (arrays split across processes all-gathered):
    what a file writer on process 0 needs (collective: every process calls it)."""
    if jax.process_count() == 1:
        return tree
    from jax.experimental import multihost_utils
    return jax.tree.map(lambda x: np.asarray(multihost_utils.process_allgather(x, tiled=True))
                        if isinstance(x, jax.Array) and not x.is_fully_addressable else x, tree)


def local_mesh(mesh):
    """The sub-mesh of `mesh` on this process's devices (same axis names). It must be a block of the
    global device grid (every process owns a contiguous box: true of jax.make_mesh and of the
    hybrid ICI × DCN layout)."""
    if jax.process_count() == 1:
        return mesh
    from jax.sharding import Mesh
    devs = mesh.devices
    mine = np.vectorize(lambda d: d.process_index == jax.process_index())(devs)
    idx = [np.flatnonzero(mine.any(axis=tuple(j for j in range(devs.ndim) if j != i))) for i in range(devs.ndim)]
    block = devs[np.ix_(*idx)]
    if block.size != int(mine.sum()) or not all(d.process_index == jax.process_index() for d in block.flat):
        raise ValueError("this process's devices are not a block of the mesh; rollouts need a local sub-mesh")
    return Mesh(block, mesh.axis_names, axis_types=mesh.axis_types)


_VIEWS: dict = {}  # id(global array) -> (the array, its local view): the last call's


def local_view(tree, lmesh):
    """`tree` (global arrays on a mesh) as arrays on this process's sub-mesh `lmesh`: without a copy
    where the process's shards already hold the whole array (every mesh axis the array is split over
    lies inside the process, e.g. weights replicated over a data axis that spans processes), else
    gathered through the host (a copy: weights split over processes are all-gathered). Views of the
    previous call's arrays are reused, so a frozen base maps to the same local arrays every step (and
    the decode layout's per-layer copy, memoised on array identity, is made once)."""
    if jax.process_count() == 1:
        return tree
    from jax.experimental import multihost_utils
    from jax.sharding import NamedSharding
    views: dict = {}

    def one(x):
        if not isinstance(x, jax.Array) or x.is_fully_addressable:
            return x
        hit = _VIEWS.get(id(x))
        if hit is not None and hit[0] is x:
            views[id(x)] = hit
            return hit[1]
        spec = x.sharding.spec
        axes = [a for s in spec if s is not None for a in ((s,) if isinstance(s, str) else s)]
        target = NamedSharding(lmesh, spec)
        if all(lmesh.shape[a] == x.sharding.mesh.shape[a] for a in axes):
            by_dev = {s.device: s.data for s in x.addressable_shards}
            view = jax.make_array_from_single_device_arrays(
                x.shape, target, [by_dev[d] for d in target.addressable_devices_indices_map(x.shape)])
        else:
            view = jax.device_put(np.asarray(multihost_utils.process_allgather(x, tiled=True)), target)
        views[id(x)] = (x, view)
        return view
    out = jax.tree.map(one, tree)
    _VIEWS.clear()
    _VIEWS.update(views)
    return out
