"""Rollouts on the mesh, measured (`launch.sweep --rollout`): for each mesh shape and decode
layout, a prefill and one decode segment of the sampler with its state sharded on the mesh
(rollout.placement), and the device memory that decode holds.

Memory, per device (the largest over the mesh's devices):
    weights   the training tree's shards (the frozen base as the run holds it)
    kv        the KV cache's shards at the capacity the segment decodes into
    peak      every live array's shards on that device while decoding (the training tree, the decode
              layout's per-layer copy if any, the cache and decode state) + the compiled decode
              program's temporaries (XLA's memory analysis, per device); where the backend reports
              an allocator peak (GPU/TPU) it is recorded too ("device_peak": since process start,
              so it also holds whatever the set-up allocated)
    ratio     peak / (weights + kv): 1.0 would be weights and cache alone. The target is ≤ 1.15
              for a Qwen2.5-3B-shaped model; `per_layer` holds a second copy of the layer weights by
              design (~2.0), `stacked` holds none but the backend may materialise the slices as
              temporaries, `shared` reads the run's own per-layer tree.
"""

from __future__ import annotations

import dataclasses
import gc
import time

import jax
import jax.numpy as jnp
import numpy as np

from dart_jax.analysis.tables import markdown_table
from dart_jax.bench.sampler import _spec
from dart_jax.bench.shapes import model_config
from dart_jax.bench.sweep import sub_mesh
from dart_jax.models import transformer
from dart_jax.models.sharding import base_shardings
from dart_jax.rollout.placement import RolloutMesh, decode_params, new_cache
from dart_jax.rollout.sampler import cache_bucket, decode_segment, prefill

DECODE_LAYOUTS = ("stacked", "per_layer", "shared")  # the order measured: each adds no copy the next relies on


def _buffers(arrays) -> set:
    return {(s.device, s.data.unsafe_buffer_pointer()) for x in arrays for s in getattr(x, "addressable_shards", ())}


def _bytes_by_device(arrays, exclude: set = frozenset()) -> dict:
    """Bytes of the arrays' shards per device, each device buffer counted once (a shard's `.data` is
    itself a live array over the same buffer, so jax.live_arrays() lists views too); buffers in
    `exclude` (alive before the measurement began: another test's, the caller's) are not counted."""
    out: dict = {}
    seen: set = set(exclude)
    for x in arrays:
        for s in getattr(x, "addressable_shards", ()):
            key = (s.device, s.data.unsafe_buffer_pointer())
            if key not in seen:
                seen.add(key)
                out[s.device] = out.get(s.device, 0) + s.data.nbytes
    return out


def random_base(cfg, mesh, seed: int = 0):
    """A random-init base of `cfg`, created sharded on `mesh` (no device holds the whole tree)."""
    init = jax.jit(lambda k: transformer.init_params(cfg, k), out_shardings=base_shardings(cfg, mesh))
    return init(jax.random.PRNGKey(seed))


def rollout_row(cfg, base, mesh, layout: str, batch: int, prompt: int, new: int, exclude: set = frozenset()) -> dict:
    """One (mesh, layout) measurement; `base` is already placed on `mesh`; `exclude`: device buffers
    that were alive before the measurement and are not its."""
    placement = RolloutMesh.of(mesh)
    spec = dataclasses.replace(_spec(cfg), placement=placement)
    dbase = decode_params(base, layout)
    toks = jnp.asarray(np.random.default_rng(1).integers(100, cfg.vocab_size, (batch, prompt)), jnp.int32)
    pos = jnp.broadcast_to(jnp.arange(prompt, dtype=jnp.int32), (batch, prompt))
    capacity = cache_bucket(prompt + new + 1)
    ones, stop_on, budget = jnp.ones((batch,), bool), jnp.ones((batch, 1), bool), jnp.full((batch,), new, jnp.int32)
    state, _ = prefill(dbase, None, toks, pos, new_cache(cfg, batch, capacity, placement), jax.random.PRNGKey(0),
                       spec=spec)
    jax.block_until_ready(state)
    t0 = time.perf_counter()
    compiled = decode_segment.lower(dbase, None, state, ones, stop_on, budget, spec=spec, length=new).compile()
    compile_s = time.perf_counter() - t0
    ma = compiled.memory_analysis()
    temp = int(ma.temp_size_in_bytes) if ma is not None else 0
    # everything alive now is what decode holds: the training tree, the layout copy, the state
    live = _bytes_by_device(jax.live_arrays(), exclude)
    weights = _bytes_by_device(jax.tree.leaves(base))
    kv = _bytes_by_device(jax.tree.leaves(state.cache))
    t = time.perf_counter()
    state, seg = compiled(dbase, None, state, ones, stop_on, budget)
    jax.block_until_ready(seg.tokens)
    seconds = time.perf_counter() - t
    devs = list(mesh.devices.flat)
    peak = max(live.get(d, 0) + temp for d in devs)
    w, c = max(weights.get(d, 0) for d in devs), max(kv.get(d, 0) for d in devs)
    stats = devs[0].memory_stats() or {}
    row = {"mesh": "x".join(map(str, mesh.devices.shape)), "devices": len(devs), "layout": layout,
           "batch": batch, "prompt": prompt, "new_tokens": new, "capacity": capacity,
           "compile_s": compile_s, "decode_s": seconds, "tokens_per_s": batch * new / seconds,
           "weights_gib": w / 2 ** 30, "kv_gib": c / 2 ** 30, "temp_gib": temp / 2 ** 30,
           "peak_gib": peak / 2 ** 30, "ratio": peak / (w + c),
           "kv_sharding": _spec_str(state.cache["k"][0].sharding),
           "device_peak_gib": (max((d.memory_stats() or {}).get("peak_bytes_in_use", 0) for d in devs) / 2 ** 30
                               if "peak_bytes_in_use" in stats else None)}
    del state, seg, dbase
    return row


def _spec_str(sharding) -> str:
    """A sharding's PartitionSpec without trailing Nones (jax drops them on computed arrays)."""
    spec = list(sharding.spec)
    while spec and spec[-1] is None:
        spec.pop()
    return str(type(sharding.spec)(*spec))


def _abstract(tree):
    return jax.tree.map(lambda x: jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=x.sharding), tree)


def abstract_row(cfg, mesh, layout: str, batch: int, prompt: int, new: int) -> dict:
    """`rollout_row` from XLA's memory analysis alone (nothing allocated, nothing run): for models that
    do not fit the host (a 3B model on a 24 GB CPU VM). peak = the decode program's arguments +
    temporaries per device, + the resident stacked layers under `per_layer` (the copy is the argument).
    Checked against `rollout_row` on the small shape: the same ratios to 0.01 (docs/performance.md)."""
    placement = RolloutMesh.of(mesh)
    spec = dataclasses.replace(_spec(cfg), placement=placement)
    sh = base_shardings(cfg, mesh)
    stacked = jax.eval_shape(lambda k: transformer.init_params(cfg, k), jax.random.PRNGKey(0))
    stacked = jax.tree.map(lambda a, s: jax.ShapeDtypeStruct(a.shape, a.dtype, sharding=s), stacked, sh)
    if layout == "stacked":
        dbase = stacked
    else:  # the per-layer tree's shapes and shardings (the copy's, or the shared tree's)
        def split(layers, embed):
            return transformer._split_layers(layers, embed, layout == "per_layer")
        layers, head = jax.eval_shape(split, stacked["layers"], stacked["embed"])
        drop = transformer._drop_leading
        layers = tuple(jax.tree.map(lambda a, s: jax.ShapeDtypeStruct(a.shape, a.dtype, sharding=drop(s.sharding)),
                                    lay, stacked["layers"]) for lay in layers)
        dbase = dict(stacked, layers=layers)
        if head is not None:
            dbase["head"] = jax.ShapeDtypeStruct(head.shape, head.dtype,
                                                 sharding=transformer._transposed(stacked["embed"].sharding))
    capacity = cache_bucket(prompt + new + 1)
    toks = jax.ShapeDtypeStruct((batch, prompt), jnp.int32)
    cache = _abstract(jax.eval_shape(lambda: new_cache(cfg, batch, capacity, placement)))
    cache = jax.tree.map(lambda a, s: jax.ShapeDtypeStruct(a.shape, a.dtype, sharding=s), cache,
                         placement.cache(cfg, batch, capacity))
    state, _ = jax.eval_shape(lambda b, t, c: prefill(b, None, t, t, c, jax.random.PRNGKey(0), spec=spec),
                              dbase, toks, cache)
    # the state as the sampler holds it between calls: cache and per-row vectors placed (eval_shape
    # drops shardings), so the compiled decode sees the real input layout
    state = jax.tree.map(
        lambda a: jax.ShapeDtypeStruct(a.shape, a.dtype, sharding=placement.rows(a.shape) if a.ndim
                                       else jax.sharding.NamedSharding(mesh, jax.sharding.PartitionSpec())),
        state.replace(cache=None))
    state = state.replace(cache=cache)
    ones, stop_on, budget = (jax.ShapeDtypeStruct((batch,), bool), jax.ShapeDtypeStruct((batch, 1), bool),
                             jax.ShapeDtypeStruct((batch,), jnp.int32))
    t0 = time.perf_counter()
    compiled = decode_segment.lower(dbase, None, state, ones, stop_on, budget, spec=spec, length=new).compile()
    ma = compiled.memory_analysis()
    per_dev = lambda tree: sum(int(np.prod(x.sharding.shard_shape(x.shape))) * x.dtype.itemsize  # noqa: E731
                               for x in jax.tree.leaves(tree))
    w, c = per_dev(stacked), per_dev(cache)
    args = int(ma.argument_size_in_bytes)
    # per_layer: the run also holds its stacked layers (the argument is the copy + the shared embedding)
    peak = args + int(ma.temp_size_in_bytes) + (per_dev(stacked["layers"]) if layout == "per_layer" else 0)
    return {"mesh": "x".join(map(str, mesh.devices.shape)), "devices": mesh.size, "layout": layout, "batch": batch,
            "prompt": prompt, "new_tokens": new, "capacity": capacity, "compile_s": time.perf_counter() - t0,
            "weights_gib": w / 2 ** 30, "kv_gib": c / 2 ** 30, "temp_gib": ma.temp_size_in_bytes / 2 ** 30,
            "peak_gib": peak / 2 ** 30, "ratio": peak / (w + c), "source": "xla memory analysis (not run)",
            "kv_sharding": _spec_str(cache["k"][0].sharding)}


def sweep_rollout(cfg, shapes, batch: int = 16, prompt: int = 256, new: int = 16,
                  layouts=DECODE_LAYOUTS, base_for=None, log=print, abstract: bool = False) -> list[dict]:
    """Rows of `rollout_row` for every mesh shape × decode layout; `base_for(mesh)` places the model
    (default: a random init of `cfg`, sharded). `abstract`: `abstract_row` instead (nothing runs)."""
    rows = []
    for shape in shapes:
        mesh, error = sub_mesh(shape)
        if error:
            rows.append(error)
            continue
        # what the process held already is not this measurement's; holding the arrays keeps their buffers
        # from being freed and their addresses reused by the measurement's own arrays
        held = jax.live_arrays()
        before = _buffers(held)
        if abstract:
            for layout in sorted(layouts, key=DECODE_LAYOUTS.index):
                rows.append(abstract_row(cfg, mesh, layout, batch, prompt, new))
                log(f"rollout sweep: {rows[-1]}")
            continue
        base = (base_for or (lambda m: random_base(cfg, m)))(mesh)
        for layout in sorted(layouts, key=DECODE_LAYOUTS.index):  # stacked before per_layer's copy exists
            if layout == "shared":  # the run's tree becomes the per-layer one (the stacked arrays are freed)
                base = transformer.unstack_layers(base)
                gc.collect()
            try:
                rows.append(rollout_row(cfg, base, mesh, layout, batch, prompt, new, before))
            except Exception as e:  # e.g. out of memory for one layout: the others still run
                rows.append({"mesh": "x".join(map(str, shape)), "layout": layout, "error": f"{type(e).__name__}: {e}"})
            transformer.clear_decode_layout()  # the per-layer copy dies with this mesh's rows
            gc.collect()
            log(f"rollout sweep: {rows[-1]}")
        del base, held
        gc.collect()
    return rows


def sweep_for(config, model: str, shapes, batch: int, prompt: int, new: int, dtype: str = "bfloat16",
              log=print, abstract: bool = False) -> list[dict]:
    """`launch.sweep --rollout=MODEL`: the config's model (`config`, loaded sharded per mesh) or a
    random-init model of an accelerator-suite shape (`3b`, `small`, `tiny`) in `dtype`."""
    if model == "config":
        from dart_jax.checkpoints.registry import load_model, open_source
        from dart_jax.run.spec import run_spec
        over = run_spec(config).model.overrides()
        _, cfg = open_source(config.model.path, **over)
        return sweep_rollout(cfg, shapes, batch, prompt, new,
                             base_for=lambda mesh: load_model(config.model.path, mesh=mesh, **over)[1], log=log,
                             abstract=abstract)
    return sweep_rollout(model_config(model, dtype), shapes, batch, prompt, new, log=log, abstract=abstract)


def table(rows: list[dict]) -> str:
    out = []
    for r in rows:
        if "error" in r:
            out.append([r["mesh"], r.get("layout", ""), r["error"], *[""] * 6])
            continue
        tps = f"{r['tokens_per_s']:.1f}" if "tokens_per_s" in r else "(not run)"
        out.append([r["mesh"], r["layout"], f"`{r['kv_sharding']}`", tps,
                    *(f"{r[k] * 1024:.1f}" for k in ("weights_gib", "kv_gib", "temp_gib", "peak_gib")),
                    f"{r['ratio']:.3f}"])
    return markdown_table(["mesh", "decode layout", "KV sharding", "tokens/s", "weights MiB/dev", "KV MiB/dev",
                           "temp MiB/dev", "peak MiB/dev", "peak / (weights + KV)"], out)
