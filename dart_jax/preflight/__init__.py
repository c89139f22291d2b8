"""Preflight: what a GRPO run needs, checked before any model loads, so that a wrong path, a dead
retriever or a run that cannot fit its devices fails in seconds with what to do, not after model
load, compile and 300 s of retries.

    retriever, databases, datasets, weights: dart_jax/run/checks.py
    retriever   QA: `retriever.url` answers one real query (a dead port fails in seconds);
                `retriever.index_dir` holds meta.json and its files; neither: the shipped sample index
    databases   SQL: every `db_root` exists and holds the databases its rows name (a sample)
    datasets    every `data.train` / `eval.data` file exists
    weights     `model.path` resolves (a path, an embedded name, a hub id in the local HF cache);
                `warm_start` / `init_from` exist
    mesh        the run's settings and their rules (run.spec.run_spec) and `mesh.shape` against the devices
                (this module)
    memory      (preflight/memory.py) per device, from XLA's memory analysis of the programs the run compiles,
                at the true shapes with abstract arrays (nothing allocated, no weights read): the jitted GRPO train
                step (fp32 masters + AdamW moments of the trainable tree, the frozen base, one
                mini-batch of micro-batches at the config's lengths) and one decode segment of the
                rollout at its batch (`rollout.chunk_rows` rows when the share is decoded in chunks) and
                maximum cache length; against the device's memory. Over budget: the numbers and the
                first of a few mesh / decode layout / remat candidates that fits, or, when the rollout's
                KV cache is what does not fit, the largest `rollout.chunk_rows` that does.

The architecture comes from the model's config.json; when the weights are absent the paper models'
architectures shipped in data/model_configs/<Org>/<Name>/config.json stand in (the output says so).
On the CPU backend without a planning budget the memory check is skipped: host RAM is not device
memory. Planned on forced CPU devices the figures are XLA:CPU's analysis of the same programs; XLA on
a GPU or TPU schedules and reuses buffers its own way, so the check run on the accelerator itself
(launch.train runs it) is the one to trust near the limit. jax on GPU claims 75% of device memory
unless XLA_PYTHON_CLIENT_MEM_FRACTION says otherwise; the budget read from a GPU (`bytes_limit`)
already reflects that, a planning budget (`device_memory_gib`) is taken as given.
"""

from __future__ import annotations

from typing import Callable

from dart_jax.preflight.memory import check_memory
from dart_jax.run.checks import (
    Check,
    Report,
    check_databases,
    check_datasets,
    check_retriever,
    check_weights,
    fail,
    ok,
    skipped,
)
from dart_jax.run.spec import run_spec


# -- mesh -----------------------------------------------------------------------------------------------
def check_mesh(config, processes: int) -> Check:
    """The settings and their rules for the processes (run.spec.run_spec) and the mesh against the
    devices (run.policy.run_mesh)."""
    import jax

    from dart_jax.run.policy import run_mesh
    try:
        mesh = run_mesh(run_spec(config, processes))
    except ValueError as e:
        fix = "set --config.mesh.shape='(DATA,FSDP,TENSOR)' with a product ≤ the devices" if "mesh" in str(e) \
            else "fix the settings named"
        return fail("mesh", f"{e}; {fix}", devices=jax.device_count())
    shape = tuple(int(s) for s in mesh.devices.shape)
    if shape[0] % processes:
        return fail("mesh", f"mesh.shape={shape}: the data axis ({shape[0]}) must be a multiple of the {processes} "
                            "processes (each rolls out on its own devices); set --config.mesh.shape")
    return ok("mesh", f"{'x'.join(map(str, shape))} (data×fsdp×tensor) on {mesh.size} of {jax.device_count()} devices, "
                      f"{processes} process(es)", shape=shape, devices=jax.device_count(), processes=processes)


# -- all ------------------------------------------------------------------------------------------------
def preflight(config, processes: int | None = None, device_memory_gib: float | None = None,
              prompt_tokens: int | None = None, log: Callable[[str], None] | None = None) -> Report:
    """Every check, in the order a run meets what it checks; the checks that read the settings only
    when they parse (else `mesh` names what is wrong), the memory estimate only when the mesh and the
    settings pass (it compiles at their shapes)."""
    import jax
    processes = processes or jax.process_count()
    try:
        spec = run_spec(config, processes)
    except ValueError:
        spec = None
    checks = ([check_retriever(spec), check_databases(spec), check_datasets(spec), check_weights(spec)]
              if spec is not None else [])
    checks.append(check_mesh(config, processes))
    if checks[-1].failed:
        checks.append(skipped("memory", "the mesh or the settings fail (see mesh)"))
    else:
        try:
            checks.append(check_memory(spec, processes, device_memory_gib, prompt_tokens, log=log))
        except Exception as e:  # noqa: BLE001 — an estimate that cannot be made must not stop the run
            first = (str(e).splitlines() or [""])[0]
            checks.append(skipped("memory", f"not estimated ({type(e).__name__}: {first}; an internal error: "
                                            "please report it)"))
    return Report(checks + agreement(checks))


def agreement(checks: list[Check]) -> list[Check]:
    """Multi-process: every process learns which processes failed which checks, so that all of them stop
    together (a process that stopped alone would leave the others waiting in their first collective).
    -> [] with one process, else one `processes` check."""
    import jax

    from dart_jax.parallel.distributed import allgather_objects
    if jax.process_count() == 1:
        return []
    failed = allgather_objects(sorted(c.name for c in checks if c.failed))
    others = {p: names for p, names in enumerate(failed) if names and p != jax.process_index()}
    if others:
        return [fail("processes", "process(es) " + ", ".join(f"{p} ({', '.join(n)})" for p, n in sorted(others.items()))
                     + " failed their checks; fix what their output names", failed=others)]
    return [ok("processes", f"all {jax.process_count()} processes passed", processes=jax.process_count())]
