"""Mesh-shape sweep of the GRPO train step: compile time, step time and memory per device.

For each mesh shape the config's model, method and loss are set up on a sub-mesh of the devices,
the step is compiled with explicit in/out shardings for a synthetic mini-batch of the config's
micro-batch layout ([M, micro_batch, length]), then timed. Memory: the device's peak allocator
statistic where the backend reports one (GPU/TPU), else XLA's compiled-program estimate
(arguments + outputs + temporaries − aliased, per device). Both include the train state: fp32 master
parameters and fp32 AdamW moments (12 bytes per trainable parameter, also reported on their own as
"state GiB/device"), plus the frozen base in `model.param_dtype`.
"""

from __future__ import annotations

import math
import time

import jax
import jax.numpy as jnp
import numpy as np

from dart_jax.adapters.method import init_adapters
from dart_jax.analysis.tables import markdown_table
from dart_jax.bench.train import synthetic_batch
from dart_jax.checkpoints.registry import load_model
from dart_jax.parallel.mesh import make_mesh
from dart_jax.rl.optim import make_optimizer
from dart_jax.rl.placement import (
    jit_step,
    microbatch_sharding,
    place_state,
    state_bytes_per_device,
)
from dart_jax.rl.step import BATCH_KEYS, make_train_step
from dart_jax.run.spec import run_spec


def sub_mesh(shape: tuple[int, int, int]):
    """-> (mesh on the first prod(shape) devices, None), or (None, the sweep row saying it cannot)."""
    n = math.prod(shape)
    if n > jax.device_count():
        return None, {"mesh": "x".join(map(str, shape)), "error": f"needs {n} devices, {jax.device_count()} available"}
    return make_mesh(shape, jax.devices()[:n]), None


def sweep_mesh(config, shapes: list[tuple[int, int, int]], length: int = 512, steps: int = 3) -> list[dict]:
    spec = run_spec(config)
    overrides = spec.model.overrides()
    method, lc, oc = spec.method, spec.loss, spec.optim
    micro, mini = spec.train.micro_batch, spec.train.mini_batch
    rows = []
    for shape in shapes:
        mesh, error = sub_mesh(shape)
        if error:
            rows.append(error)
            continue
        cfg, base = load_model(config.model.path, mesh=mesh, **overrides)
        opt = make_optimizer(oc)
        state, base = place_state(method, cfg, base, init_adapters(method, cfg, jax.random.PRNGKey(0)), opt, mesh)
        state_gib = state_bytes_per_device(state) / 2 ** 30
        data = synthetic_batch(cfg, mini, length)
        m = mini // micro
        batch = {k: jnp.asarray(data[k]).reshape((m, micro) + data[k].shape[1:]) for k in BATCH_KEYS}
        batch = {k: jax.device_put(v, microbatch_sharding(v.shape, mesh)) for k, v in batch.items()}
        fn = jit_step(make_train_step(cfg, method, lc, oc), state, base, {k: v.shape for k, v in batch.items()}, mesh)
        key = jax.random.PRNGKey(0)
        t0 = time.perf_counter()
        compiled = fn.lower(state, base, batch, key, np.int32(0)).compile()
        compile_s = time.perf_counter() - t0
        times = []
        for _ in range(steps):
            t = time.perf_counter()
            state, metrics = compiled(state, base, batch, key, np.int32(0))
            jax.block_until_ready(metrics)
            times.append(time.perf_counter() - t)
        stats = mesh.devices.flat[0].memory_stats() or {}
        if "peak_bytes_in_use" in stats:
            mem, source = max((d.memory_stats() or {}).get("peak_bytes_in_use", 0) for d in mesh.devices.flat), "peak"
        else:
            ma = compiled.memory_analysis()
            mem = (ma.argument_size_in_bytes + ma.output_size_in_bytes + ma.temp_size_in_bytes
                   - ma.alias_size_in_bytes)
            source = "xla estimate"
        tokens = mini * length
        rows.append({"mesh": "x".join(map(str, shape)), "devices": mesh.size, "compile_s": compile_s,
                     "step_s": float(np.median(times[1:] if len(times) > 1 else times)),
                     "tokens_per_s": tokens / float(np.median(times[1:] if len(times) > 1 else times)),
                     "memory_gib_per_device": mem / 2 ** 30, "memory_source": source,
                     "state_gib_per_device": state_gib,
                     "loss": float(metrics["loss"])})
    return rows


def table(rows: list[dict]) -> str:
    out = []
    for r in rows:
        if "error" in r:
            out.append([r["mesh"], r["error"], *[""] * 5])
            continue
        out.append([r["mesh"], f"{r['compile_s']:.1f}", f"{r['step_s']:.3f}", f"{r['tokens_per_s']:.0f}",
                    f"{r['memory_gib_per_device']:.3f} ({r['memory_source']})", f"{r['state_gib_per_device']:.3f}",
                    f"{r['loss']:.6f}"])
    return markdown_table(["mesh (data×fsdp×tensor)", "compile s", "step s", "tokens/s", "memory GiB/device",
                           "state GiB/device (fp32 masters + moments)", "loss"], out)


def write_csv(rows: list[dict], path: str) -> None:
    import csv
    keys = sorted({k for r in rows for k in r})
    with open(path, "w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=keys)
        w.writeheader()
        w.writerows(rows)
