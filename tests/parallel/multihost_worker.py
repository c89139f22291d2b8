"""One process of tests/parallel/test_multihost.py (run as a script, not collected by pytest):

    python tests/parallel/multihost_worker.py MODEL_DIR OUT_DIR NUM_PROCESSES PROCESS_ID PORT LOCAL_DEVICES

trains 2 GRPO steps of the tiny model on mesh (2, 1, 4) — data over the two processes, tensor inside
each, with held-out evaluations (two batches: one per process) at steps 0 and 2 — and process 0
writes the final trainable parameters (gathered from every process) to OUT_DIR/params.npz; then
evaluates the trained run (launch.evaluate's function: 5 questions × 2 samples at T = 1 in batches
of 2, so the processes take rounds of batches and the last round has one) into OUT_DIR/eval; every
process also runs a > 4 MiB reduce-scatter (gloo had bugs above 4 MiB upstream) and process 0
records its check in OUT_DIR/collectives.json."""

import json
import os
import sys

model_dir, out_dir, nproc, pid, port, local = sys.argv[1], sys.argv[2], *map(int, sys.argv[3:7])
sys.path[:0] = [os.path.join(os.path.dirname(__file__), "..", ".."), os.path.join(os.path.dirname(__file__), "..")]
from xla_env import xla_flags  # noqa: E402

os.environ["XLA_FLAGS"] = xla_flags(local)  # the suite's compile settings (tests/xla_env.py)

from dart_jax.parallel.distributed import initialize  # noqa: E402

if nproc > 1:
    assert initialize(f"127.0.0.1:{port}", nproc, pid)

import jax  # noqa: E402
import numpy as np  # noqa: E402
from jax.experimental import multihost_utils  # noqa: E402
from jax.sharding import NamedSharding, PartitionSpec as P  # noqa: E402

from dart_jax.parallel.mesh import make_mesh  # noqa: E402
from dart_jax.rl.trainer import Trainer  # noqa: E402
from rl.test_trainer import _config as trainer_config  # noqa: E402

assert jax.device_count() == 8 and jax.process_count() == nproc

# a reduce-scatter (lax.psum_scatter: the collective itself, not whatever XLA makes of a sum) of 8 MiB
# per device: device d holds d + 1 everywhere; the sum is scattered in 8 blocks (each element 1 + … + 8)
try:
    from jax import shard_map
except ImportError:  # older jax
    from jax.experimental.shard_map import shard_map
mesh = make_mesh((8, 1, 1))
n = 2 ** 21  # float32: 8 MiB per device
rows = jax.make_array_from_callback((8 * n,), NamedSharding(mesh, P("data")),
                                    lambda idx: np.full((n,), float(idx[0].start // n + 1), np.float32))
fn = jax.jit(shard_map(lambda x: jax.lax.psum_scatter(x, "data", scatter_dimension=0, tiled=True), mesh=mesh,
                       in_specs=P("data"), out_specs=P("data")))
hlo = fn.lower(rows).compile().as_text()
got = np.asarray(multihost_utils.process_allgather(fn(rows), tiled=True))
ok = bool(np.all(got == 36.0)) and got.shape == (n,) and "reduce-scatter" in hlo

c = trainer_config(model_dir, out_dir, steps=2)  # the trainer tests' tiny run, resized for 8 devices:
c.eval.n = 10  # two held-out batches of 8 and 2 (one per process)
c.train.mini_batch, c.train.micro_batch = 4, 2
c.output.export_adapters = True  # a collective: the adapters split across processes are gathered for process 0
c.mesh.shape = (2, 1, 4)
t = Trainer(c)


def host(tree):
    return [np.asarray(multihost_utils.process_allgather(x, tiled=True)) if not x.is_fully_addressable
            else np.asarray(x) for x in jax.tree.leaves(tree)]


init = host(t.state.params)
t.run()
leaves = host(t.state.params)
if pid == 0:
    np.savez(os.path.join(out_dir, "params.npz"), *leaves)
    np.savez(os.path.join(out_dir, "init.npz"), *init)
    with open(os.path.join(out_dir, "collectives.json"), "w") as f:
        json.dump({"reduce_scatter_ok": ok, "bytes_per_device_in": n * 4}, f)

from dart_jax.eval.job import evaluate  # noqa: E402
from dart_jax.eval.runner import EvalOptions  # noqa: E402

evaluate(c, os.path.join(out_dir, "eval"), ["nq"], EvalOptions(n_samples=2, temperature=1.0, limit=5, batch=2,
                                                               progress=False), checkpoint=out_dir)
print(f"process {pid} done", flush=True)
