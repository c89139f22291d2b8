"""The preflight's memory estimate: per device, from XLA's memory analysis of the programs a run
compiles, at the true shapes with abstract arrays (nothing allocated, no weights read): the jitted
GRPO train step (fp32 masters + AdamW moments of the trainable tree, the frozen base, one mini-batch
of micro-batches at the config's lengths) and one decode segment of the rollout at its batch
(`rollout.chunk_rows` rows when the share is decoded in chunks) and maximum cache length, against the
device's memory. Over budget: the numbers and the first of a few mesh / decode layout / remat
candidates that fits, or, when the rollout's KV cache is what does not fit, the largest
`rollout.chunk_rows` that does. (dart_jax/preflight/__init__.py says how to read XLA:CPU's figures.)
"""

from __future__ import annotations

import dataclasses
import math
import time
from typing import Any, Callable

from dart_jax.run.checks import GIB, Check, architecture, fail, ok, skipped
from dart_jax.run.spec import RunSpec

# prompt tokens a trajectory starts with when the config does not say (`prompt_tokens`): Search-R1's
# instruction + a question fits 512; SkyRL-SQL's prompt carries the database schema (up to ~2k tokens)
PROMPT_TOKENS = {"qa": 512, "sql": 2048}


def mesh_shape(spec: RunSpec, devices: int) -> tuple[int, int, int]:
    """`mesh.shape`, or every device on the data axis (run.spec.MeshSettings.resolved)."""
    return spec.mesh.resolved(devices)


# -- memory ---------------------------------------------------------------------------------------------
@dataclasses.dataclass(frozen=True)
class Setting:
    """What the memory estimate varies: the mesh, the decode layout, the remat policy and the rollout's
    chunk (trajectories decoded at once; 0 = the process's whole share)."""
    mesh: tuple[int, int, int]
    layout: str
    remat: str
    chunk_rows: int = 0

    def describe(self) -> str:
        return (f"--config.mesh.shape='({','.join(map(str, self.mesh))})' "
                f"--config.rollout.decode_layout={self.layout} --config.model.remat_policy={self.remat}"
                + (f" --config.rollout.chunk_rows={self.chunk_rows}" if self.chunk_rows else ""))

    def chunked(self, rows: int) -> "Setting":
        return dataclasses.replace(self, chunk_rows=rows)


def _sds(tree, shardings):
    import jax
    return jax.tree.map(lambda a, s: jax.ShapeDtypeStruct(a.shape, a.dtype, sharding=s), tree, shardings)


def per_device(tree) -> int:
    """Bytes of one device's shard of every leaf of an abstract (sharded) tree."""
    import jax
    return sum(math.prod(x.sharding.shard_shape(x.shape)) * x.dtype.itemsize for x in jax.tree.leaves(tree))


def per_layer_tree(base):
    """The abstract base with `layers` as per-layer dicts, each placed as its source minus the layer axis
    (models.transformer.unstack_layers)."""
    import jax

    from dart_jax.models import transformer
    layers, _ = jax.eval_shape(lambda lay, emb: transformer._split_layers(lay, emb, False), base["layers"],
                               base["embed"])
    drop = transformer._drop_leading
    layers = tuple(jax.tree.map(lambda a, s: jax.ShapeDtypeStruct(a.shape, a.dtype, sharding=drop(s.sharding)),
                                lay, base["layers"]) for lay in layers)
    return dict(base, layers=layers)


def lengths(spec: RunSpec, prompt_tokens: int | None) -> dict:
    """The shapes the run reaches at most: a trajectory of `prompt` + rollout.max_response_tokens
    tokens (padded to train.pad_multiple) in the update; in the rollout, every row of this process's
    share of the step at a cache capacity holding that trajectory plus one decode segment. (The
    cache's write index is shared by the batch's rows, so a batch whose rows take their longest
    segments in different turns can grow past one row's maximum: this is the configured maximum, not
    a bound.)"""
    from dart_jax.rollout.sampler import bucket, cache_bucket
    rc, tc = spec.rollout, spec.train
    prompt = int(prompt_tokens or PROMPT_TOKENS[spec.task])
    pad = int(tc.pad_multiple) or 1
    seq = -(-(prompt + int(rc.max_response_tokens)) // pad) * pad
    segment = bucket(int(rc.max_tokens_per_turn))
    return {"prompt": prompt, "train_length": seq, "segment": segment,
            "capacity": cache_bucket(prompt + int(rc.max_response_tokens) + segment + 1)}


def train_trees(spec: RunSpec, cfg, mesh) -> tuple[Any, Any]:
    """(train state, frozen base) as abstract arrays placed as the trainer places them
    (rl.placement.place_state): nothing allocated, no weights read."""
    import jax

    from dart_jax.adapters.method import init_adapters, trainable
    from dart_jax.models import transformer
    from dart_jax.models.sharding import adapter_shardings, base_shardings
    from dart_jax.rl.optim import make_optimizer
    from dart_jax.rl.placement import state_shardings
    from dart_jax.rl.step import init_state
    method, opt = spec.method, make_optimizer(spec.optim)
    key = jax.random.PRNGKey(0)
    base = _sds(jax.eval_shape(lambda k: transformer.init_params(cfg, k), key), base_shardings(cfg, mesh))
    adapters = jax.eval_shape(lambda k: init_adapters(method, cfg, k), key)
    if adapters is not None:
        adapters = _sds(adapters, adapter_shardings(adapters, cfg, mesh))
    params = trainable(method, base, adapters)
    abstract = jax.eval_shape(lambda p: init_state(p, opt), params)
    return _sds(abstract, state_shardings(opt, abstract, jax.tree.map(lambda x: x.sharding, params), mesh)), base


def train_memory(spec: RunSpec, cfg, mesh, layout: str, seq: int) -> dict:
    """Per-device bytes of the GRPO update: XLA's memory analysis of the jitted, sharded train step
    (as bench.sweep compiles it) on abstract arrays, and the train state / frozen base on their own."""
    import jax
    import jax.numpy as jnp
    import numpy as np

    from dart_jax.rl.placement import jit_step, microbatch_sharding
    from dart_jax.rl.step import batch_keys, make_train_step
    method, lc, oc = spec.method, spec.loss, spec.optim
    state, base = train_trees(spec, cfg, mesh)
    # what the decode layout `per_layer` copies: the layers, and the [D, V] head when embeddings are tied
    copy = per_device(base["layers"]) + (per_device(base["embed"]) if cfg.tie_word_embeddings else 0)
    if layout == "shared" and not method.trains_base:
        base = per_layer_tree(base)  # the trainer holds the frozen base per layer for both stages
    tc = spec.train
    m, b = tc.mini_batch // tc.micro_batch, tc.micro_batch
    floats = ("loss_mask", "old_logp", "ref_logp", "advantages")
    shapes = {k: (m, b) if k == "advantages" else (m, b, seq) for k in batch_keys(lc)}
    batch = {k: jax.ShapeDtypeStruct(s, jnp.float32 if k in floats else jnp.int32,
                                     sharding=microbatch_sharding(s, mesh)) for k, s in shapes.items()}
    fn = jit_step(make_train_step(cfg, method, lc, oc), state, base, shapes, mesh)
    compiled = fn.lower(state, base, batch, jax.random.PRNGKey(0), np.int32(0)).compile()
    ma = compiled.memory_analysis()
    step = (ma.argument_size_in_bytes + ma.output_size_in_bytes + ma.temp_size_in_bytes - ma.alias_size_in_bytes)
    return {"state": per_device(state), "base": per_device(base), "batch": per_device(batch),
            "step": int(step), "step_temp": int(ma.temp_size_in_bytes), "layer_copy": copy,
            "models": 2 if method.variant == "2agent" else 1}


def decode_memory(cfg, mesh, layout: str, rows: int, prompt: int, segment: int) -> dict:
    """Per-device bytes of one decode segment at the rollout's batch and maximum cache length
    (bench.rollout_mesh.abstract_row: XLA's memory analysis, nothing allocated)."""
    from dart_jax.bench.rollout_mesh import abstract_row
    row = abstract_row(cfg, mesh, layout, rows, prompt, segment)
    return {"peak": int(row["peak_gib"] * GIB), "kv": int(row["kv_gib"] * GIB), "temp": int(row["temp_gib"] * GIB),
            "weights": int(row["weights_gib"] * GIB), "capacity": row["capacity"]}


class MemoryModel:
    """Estimates for one run spec on the devices at hand, memoised per program (a candidate search
    recompiles only what a candidate changes)."""

    def __init__(self, spec: RunSpec, cfg, processes: int, prompt_tokens: int | None = None):
        self.spec, self.cfg, self.processes = spec, cfg, processes
        self.len = lengths(spec, prompt_tokens)
        tc = spec.train
        self.rows = tc.prompts_per_step * tc.group_size // processes  # this process's share of a step
        self.group_size = int(tc.group_size)
        self.trains_base = spec.method.trains_base
        self._train: dict = {}
        self._decode: dict = {}
        self._resident: dict = {}

    def _mesh(self, shape):
        import jax

        from dart_jax.parallel.mesh import make_mesh
        return make_mesh(shape, jax.devices()[:math.prod(shape)])

    def decode_rows(self, s: Setting) -> int:
        """Rows the rollout decodes at once under `s`: a chunk of the share, or the whole share."""
        return min(s.chunk_rows, self.rows) if s.chunk_rows else self.rows

    def chunk_candidates(self) -> list[int]:
        """chunk_rows to try, largest first: the share halved down to one GRPO group, each rounded
        down to whole groups."""
        out, c = [], self.rows
        while c > self.group_size:
            c = max(self.group_size, c // 2 // self.group_size * self.group_size)
            out.append(c)
        return out

    def layout(self, s: Setting) -> str:
        """The layout the run really decodes with: a trained base is copied per layer even under `shared`."""
        return "per_layer" if s.layout == "shared" and self.trains_base else s.layout

    def update(self, s: Setting) -> dict:
        """Bytes per device of the update under `s`: the step's arguments, outputs and temporaries, plus
        the decode layout's per-layer copy, which stays memoised through the update (models.transformer)."""
        layout = self.layout(s)
        key = (s.mesh, s.remat, layout == "shared")
        if key not in self._train:
            self._train[key] = train_memory(self.spec, self.cfg.replace(remat_policy=s.remat), self._mesh(s.mesh),
                                            layout, self.len["train_length"])
        t = dict(self._train[key])
        t["layout_copy"] = t["layer_copy"] if layout == "per_layer" else 0
        t["train"] = t["step"] + t["layout_copy"]
        return t

    def estimate(self, s: Setting) -> dict:
        """Bytes per device of the update and of the rollout under `s`; `peak` the larger. The rollout
        holds the train state, (full fine-tuning) the frozen reference beside the trained copy it
        decodes with, and per model the decode program's weights, cache and layout copy."""
        t = self.update(s)
        layout, rows = self.layout(s), self.decode_rows(s)
        local = (s.mesh[0] // self.processes, s.mesh[1], s.mesh[2])
        if (local, layout, rows) not in self._decode:
            self._decode[(local, layout, rows)] = decode_memory(
                self.cfg, self._mesh(local), layout, rows,
                self.len["prompt"] + int(self.spec.rollout.max_response_tokens), self.len["segment"])
        d = self._decode[(local, layout, rows)]
        ref = t["base"] if self.trains_base else 0
        decode = t["state"] + ref + t["models"] * (d["peak"] - d["temp"]) + d["temp"]
        return {**t, "setting": s, "kv": d["kv"] * t["models"], "decode": decode, "capacity": d["capacity"],
                "rows": rows, "share": self.rows, "peak": max(t["train"], decode)}

    def resident(self, mesh: tuple[int, int, int]) -> int:
        """Bytes per device of the train state and the frozen base alone on `mesh` (no compile): a
        setting whose resident part is over the budget needs no compile to be ruled out."""
        if mesh not in self._resident:
            state, base = train_trees(self.spec, self.cfg, self._mesh(mesh))
            self._resident[mesh] = per_device(state) + per_device(base)
        return self._resident[mesh]

    def kv_floor(self, local_devices: int, rows: int | None = None) -> int:
        """Bytes per device of the rollout's KV cache (every model's) for `rows` decoded at once (the
        whole share by default) spread over every local device: no mesh, layout or remat goes below it."""
        cfg = self.cfg
        per_slot = 2 * cfg.num_layers * cfg.num_kv_heads * cfg.head_dim * cfg.dtype.itemsize + 4  # k, v; position
        models = 2 if "2agent" == self.spec.method.variant else 1
        return models * (rows or self.rows) * self.len["capacity"] * per_slot // local_devices


def candidates(current: Setting, trains_base: bool, processes: int) -> list[Setting]:
    """Settings to try when `current` does not fit, cheapest first: on the current mesh a decode
    layout without a weight copy (stacked), remat of the attention scores (dots_no_batch) or of
    everything (full: a second forward); then the same on meshes that shard the weights, the train
    state and the micro-batch's rows further, fewer devices per shard first (fsdp before tensor: fsdp
    gathers a layer's weights once, tensor exchanges activations every projection). The `shared`
    layout (a frozen base held per layer: training unrolls the layers) comes last on each mesh."""
    layouts = list(dict.fromkeys([current.layout, "stacked"]))
    remats = list(dict.fromkeys([current.remat, "dots_no_batch", "full"]))
    n = math.prod(current.mesh)
    meshes = sorted(((n // (f * t), f, t) for f in range(1, n + 1) for t in range(1, n + 1)
                     if n % (f * t) == 0 and (n // (f * t)) % processes == 0),
                    key=lambda m: (m != current.mesh, m[1] * m[2], m[2]))
    out = []
    for m in meshes:
        out += [Setting(m, lay, r, current.chunk_rows) for r in remats for lay in layouts]
        out += [] if trains_base else [Setting(m, "shared", r, current.chunk_rows) for r in remats]
    return list(dict.fromkeys(s for s in out if s != current))


def _gib(x: int) -> str:
    return f"{x / GIB:.1f}"


def figures(e: dict) -> str:
    return (f"state {_gib(e['state'])}, base {_gib(e['base'])}, step temporaries {_gib(e['step_temp'])}"
            + (f", decode-layout copy {_gib(e['layout_copy'])}" if e["layout_copy"] else "")
            + f" -> update {_gib(e['train'])}; rollout {_gib(e['decode'])} (KV cache {_gib(e['kv'])}: {e['rows']} "
            f"rows × {e['capacity']} slots"
            + (f", chunks of the share's {e['share']} rows" if e["rows"] < e["share"] else "") + ") GiB/device")


def check_memory(spec: RunSpec, processes: int, device_memory_gib: float | None, prompt_tokens: int | None = None,
                 max_estimates: int = 10, log: Callable[[str], None] | None = None) -> Check:
    """The larger of the update and the rollout per device against the budget (`device_memory_gib`,
    else the device's own limit); over it, the cheapest candidate setting that fits (`search`), or,
    when the rollout's KV cache is what does not fit, the largest `rollout.chunk_rows` that fits on the
    cheapest mesh / decode layout / remat (`chunk_search`)."""
    import jax
    dev = jax.devices()[0]
    if device_memory_gib:
        budget, source = int(device_memory_gib * GIB), "--device-memory-gib"
    else:
        limit = (dev.memory_stats() or {}).get("bytes_limit")
        if dev.platform == "cpu" or not limit:
            return skipped("memory", f"{dev.platform} backend: host RAM is not device memory "
                                     "(--device-memory-gib=G plans for G GiB devices)")
        budget, source = int(limit), f"{dev.device_kind} bytes_limit"
    cfg, arch = architecture(spec)
    if cfg is None:
        return skipped("memory", f"{arch}: the architecture is unknown")
    model = MemoryModel(spec, cfg, processes, prompt_tokens)
    current = Setting(mesh_shape(spec, jax.device_count()), spec.rollout.decode_layout, spec.model.remat_policy,
                      spec.rollout.chunk_rows)
    t0 = time.perf_counter()
    e = model.estimate(current)
    data = {"budget_gib": budget / GIB, "architecture": arch, "lengths": model.len,
            "setting": dataclasses.asdict(current),
            "estimate_gib": {k: v / GIB for k, v in e.items()
                             if k in ("state", "base", "step_temp", "layout_copy", "train", "kv", "decode", "peak")}}
    where = f"budget {budget / GIB:.1f} GiB/device ({source}); architecture from {arch}"
    if e["peak"] <= budget:
        return ok("memory", f"{figures(e)}; {where}", seconds=time.perf_counter() - t0, **data)
    local = jax.device_count() // processes
    fits, tried = None, []
    if model.kv_floor(local, model.decode_rows(current)) < budget:  # the rollout can fit at its current rows
        fits, tried = search(model, current, budget, lambda s: model.estimate(s)["peak"], max_estimates, log)
    if fits is None:  # the KV cache, or what is left beside it, does not fit: decode the share in chunks
        fits, more = chunk_search(model, current, budget, local, max_estimates, log)
        tried += more
    data.update(tried=tried, seconds=time.perf_counter() - t0)
    head = f"over budget: {figures(e)}; {where}"
    if fits:
        data["fits"] = {"setting": dataclasses.asdict(fits[0]), "gib": fits[1] / GIB}
        return fail("memory", f"{head}; fits at {_gib(fits[1])} GiB/device with {fits[0].describe()}", **data)
    return fail("memory", f"{head}; none of {len(tried)} mesh / decode layout / remat / rollout.chunk_rows settings "
                          f"estimated fits, not even decoding one GRPO group ({model.group_size} rows) at a time: "
                          "use devices with more memory or more of them", **data)


def search(model: MemoryModel, current: Setting, budget: int, measure: Callable[[Setting], int], limit: int,
           log: Callable[[str], None] | None, include_current: bool = False
           ) -> tuple[tuple[Setting, int] | None, list[dict]]:
    """The cheapest candidate (`candidates`' order, after `current` itself when `include_current`) whose
    `measure` fits `budget`, estimating at most `limit` settings: a mesh whose train state and base alone
    are over is ruled out without a compile, and one whose lightest setting (stacked layout, full remat)
    is over is skipped after that one."""
    tried: list[dict] = []

    def need(s: Setting) -> int:
        seen = next((t for t in tried if t["setting"] == dataclasses.asdict(s)), None)
        if seen is not None:
            return seen["bytes"]
        if log:
            log(f"preflight: over budget; estimating {s.describe()}")
        tried.append({"setting": dataclasses.asdict(s), "bytes": measure(s)})
        tried[-1]["gib"] = tried[-1]["bytes"] / GIB
        return tried[-1]["bytes"]

    cands = ([current] if include_current else []) + candidates(current, model.trains_base, model.processes)
    for mesh in dict.fromkeys(s.mesh for s in cands):
        if model.resident(mesh) >= budget:
            continue
        if need(Setting(mesh, "stacked", "full", current.chunk_rows)) > budget:
            continue
        for s in (c for c in cands if c.mesh == mesh):
            if len(tried) >= limit:
                return None, tried
            value = need(s)
            if value <= budget:
                return (s, value), tried
    return None, tried


def chunk_search(model: MemoryModel, current: Setting, budget: int, local_devices: int, limit: int,
                 log: Callable[[str], None] | None) -> tuple[tuple[Setting, int] | None, list[dict]]:
    """When the rollout's KV cache is what does not fit: the cheapest mesh / decode layout / remat on
    which the run fits decoding one GRPO group at a time (`search`), then on it the largest chunk_rows
    (the share halved, whole groups: `MemoryModel.chunk_candidates`) that fits. A chunk whose KV cache
    alone, plus what the one-group rollout holds beside its cache, is over is ruled out without a
    compile. Smaller chunks decode the same trajectories in more, smaller batches: slower, so the
    largest that fits is the one named."""
    chunks = [c for c in model.chunk_candidates() if not current.chunk_rows or c < current.chunk_rows]
    if not chunks:
        return None, []
    peak = lambda s: model.estimate(s)["peak"]  # noqa: E731
    found, tried = search(model, current.chunked(chunks[-1]), budget, peak, limit, log, include_current=True)
    if found is None:
        return None, tried
    small = model.estimate(found[0])
    beside = small["decode"] - small["kv"]  # grows with the rows: a lower bound for larger chunks
    for c in chunks[:-1]:
        if model.kv_floor(local_devices, c) + beside > budget:
            continue
        s = found[0].chunked(c)
        if log:
            log(f"preflight: over budget; estimating {s.describe()}")
        value = peak(s)
        tried.append({"setting": dataclasses.asdict(s), "bytes": value, "gib": value / GIB})
        if value <= budget:
            return (s, value), tried
    return found, tried
