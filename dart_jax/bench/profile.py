"""Where one GRPO update's time goes: XLA:CPU's executed HLO against PyTorch's aten ops, same shapes.

    python -m launch.bench profile            the update of `launch.bench train` (DART 2×r8, SmolLM2 4×512 fp32)
    python -m launch.bench profile_decode     the greedy decode of `launch.bench sampler`, the same way
                                              (bench/profile_decode.py)

dart_jax side: the jitted update (bench/train.py's) runs `runs` times under `jax.profiler.trace`; XLA:CPU
records one event per executed HLO instruction (thunk), which is joined to the compiled module's text
(`compiled.as_text()`): each instruction's opcode, output shape, the operations of the computation a
fusion calls, and the source path in its metadata (`rematted_computation`: recomputed by remat).
PyTorch side: the authors' concatenated-2r update (bench/train.py's `concat_2r`) under `torch.profiler`
with input shapes; aten ops by self time (no double counting of a parent's children).

Both sides are classified into the same op classes (CLASSES). On the XLA side an instruction's source
(the Python stack XLA keeps for it: the innermost dart_jax or optax file) names its part of the update;
a matmul's class comes from its shape first:
    matmul: projections   q/k/v/o, gate/up/down (M = tokens, K and N > 64)
    matmul: LoRA          a factor's matmul (K or N = the adapter rank, ≤ 64, or from models/lora.py)
    matmul: head          the vocabulary projection and its gradients (a dimension = vocab size)
    attention             batched matmuls and everything else models/attention.py runs; torch's SDPA ops
    log-probs             the rest of rl/logprobs.py (log-softmax, the target gather, entropy, their
                          gradients); torch: log-softmax, gather and their backward functions
    loss                  rl/losses.py (ratios, clipping, KL); torch: the loss's ops in its forward
    optimizer             clipping and AdamW (optax, rl/optim.py); torch: clip_grad_norm_ + AdamW.step
    LoRA routing / scale  models/lora.py's non-matmul ops (per-token select, scale)
    copies / layout       copy, transpose, slice, concatenate, pad, dynamic-(update-)slice, ... alone
    elementwise / other   norms, activations, RoPE, residuals, and anything unattributed
Per class: ms per update, share of the summed op time, the part recomputed by remat (XLA: instructions
from a `rematted_computation`), and for matmuls the FLOPs (from shapes) and the achieved GFLOP/s. Wall
time minus summed op time is the runtime's own (dispatch, buffers, host transfers, idle threads); sums
of op time can exceed wall time where a runtime runs ops on several threads at once. Torch's SDPA runs
as one fused kernel: no FLOPs are counted for it.
"""

from __future__ import annotations

import collections
import dataclasses
import glob
import gzip
import json
import math
import re
import tempfile
import time

CLASSES = ("matmul: projections", "matmul: LoRA", "matmul: head", "attention", "log-probs", "loss", "optimizer",
           "LoRA routing / scale", "copies / layout", "elementwise / other")
# the innermost matching file of an instruction's Python stack -> its class (non-matmul instructions)
SOURCES = (("dart_jax/models/attention.py", "attention"), ("dart_jax/rl/logprobs.py", "log-probs"),
           ("dart_jax/rl/losses.py", "loss"), ("dart_jax/rl/optim.py", "optimizer"), ("optax/", "optimizer"),
           ("dart_jax/models/lora.py", "LoRA routing / scale"), ("dart_jax/models/mixlora.py", "LoRA routing / scale"))
LORA_MAX_RANK = 64
TOP_OPS = 15  # the busiest non-matmul instructions listed
_COPY_OPS = {"copy", "transpose", "slice", "dynamic-slice", "dynamic-update-slice", "concatenate", "pad", "gather",
             "scatter", "bitcast", "broadcast", "reshape", "reverse", "iota", "constant", "parameter", "tuple",
             "get-tuple-element", "copy-start", "copy-done", "bitcast-convert", "convert"}
_CONTAINERS = {"while", "call", "conditional", "async-start", "async-done"}


@dataclasses.dataclass
class Instr:
    name: str
    opcode: str
    shape: str            # the output shape as printed (e.g. "f32[4,512,576]{2,1,0}", or a tuple)
    operands: list[str]
    attrs: str            # everything after the operand list
    op_name: str          # metadata op_name ("" when none)
    computation: str
    frame: int = 0        # metadata stack_frame_id (0: none)

    def calls(self) -> list[str]:
        got = re.findall(r"(?:calls|to_apply|body|condition)=%?([\w.\-]+)", self.attrs)
        m = re.search(r"called_computations=\{([^}]*)\}", self.attrs)
        if m:
            got += [c.strip().lstrip("%") for c in m.group(1).split(",") if c.strip()]
        return got


def dims(shape: str) -> list[int]:
    """[4, 512, 576] from "f32[4,512,576]{2,1,0}" (the first array of a tuple; [] for a scalar)."""
    m = re.search(r"\[([\d,]*)\]", shape)
    return [int(d) for d in m.group(1).split(",") if d] if m else []


def _split_shape(rest: str) -> tuple[str, str]:
    """("(f32[2], s32[])", "while(...)...") or ("f32[2]{0}", "add(...)...") from the text after " = "."""
    if rest.startswith("("):
        depth = 0
        for i, ch in enumerate(rest):
            depth += ch == "("
            depth -= ch == ")"
            if depth == 0:
                return rest[:i + 1], rest[i + 1:].lstrip()
    shape, _, tail = rest.partition(" ")
    return shape, tail


def _operand_list(tail: str) -> tuple[str, list[str], str]:
    """(opcode, operand names, attributes) from "dot(%a, %b), lhs_contracting_dims={1}, ..."."""
    opcode, _, after = tail.partition("(")
    depth, i = 1, 0
    while i < len(after) and depth:
        depth += after[i] == "("
        depth -= after[i] == ")"
        i += 1
    inside, attrs = after[:i - 1], after[i:]
    return opcode.strip(), re.findall(r"%([\w.\-]+)", inside), attrs


def parse_hlo(text: str) -> tuple[dict[str, Instr], dict[str, list[Instr]]]:
    """The compiled module's instructions by name, and each computation's instructions."""
    return _parse(text)[:2]


def _parse(text: str):
    """(instructions by name, instructions per computation, the Python stack of each stack frame id:
    [(file, function), ...] innermost first), from `compiled.as_text()`."""
    instrs: dict[str, Instr] = {}
    comps: dict[str, list[Instr]] = collections.defaultdict(list)
    tables: dict[str, dict[int, str]] = {"FileNames": {}, "FunctionNames": {}, "FileLocations": {}, "StackFrames": {}}
    comp, table = "", None
    for line in text.splitlines():
        s = line.strip()
        if s in tables:
            table = s
            continue
        if table is not None:
            m = re.match(r"^(\d+)\s+(.*)$", s)
            if m:
                tables[table][int(m.group(1))] = m.group(2)
                continue
            table = None
        head = re.match(r"^(?:ENTRY\s+)?%?([\w.\-]+)\s*\(.*\)\s*->\s*.*\{$", s)
        if head and " = " not in s.split("(")[0]:
            comp = head.group(1)
            continue
        m = re.match(r"^(?:ROOT\s+)?%?([\w.\-]+)\s*=\s*(.*)$", s)
        if not m or not comp:
            continue
        shape, tail = _split_shape(m.group(2))
        opcode, operands, attrs = _operand_list(tail)
        meta = re.search(r'op_name="([^"]*)"', attrs)
        frame = re.search(r"stack_frame_id=(\d+)", attrs)
        ins = Instr(m.group(1), opcode, shape, operands, attrs, meta.group(1) if meta else "", comp,
                    int(frame.group(1)) if frame else 0)
        instrs[ins.name] = ins
        comps[comp].append(ins)
    return instrs, comps, _stacks(tables)


def _stacks(t: dict[str, dict[int, str]]) -> dict[int, list[tuple[str, str]]]:
    def field(entry: str, key: str) -> int:
        m = re.search(key + r"=(\d+)", entry)
        return int(m.group(1)) if m else 0

    files = {k: v.strip('"') for k, v in t["FileNames"].items()}
    funcs = {k: v.strip('"') for k, v in t["FunctionNames"].items()}
    locs = {k: (files.get(field(v, "file_name_id"), ""), funcs.get(field(v, "function_name_id"), ""))
            for k, v in t["FileLocations"].items()}
    out = {}
    for fid in t["StackFrames"]:
        stack, cur, seen = [], fid, set()
        while cur in t["StackFrames"] and cur not in seen:  # a frame whose parent is itself (or 0) is outermost
            seen.add(cur)
            entry = t["StackFrames"][cur]
            stack.append(locs.get(field(entry, "file_location_id"), ("", "")))
            cur = field(entry, "parent_frame_id")
        out[fid] = stack
    return out


def source_class(ins: Instr, stacks: dict[int, list[tuple[str, str]]]) -> str | None:
    """The class SOURCES gives the innermost matching file of `ins`'s Python stack, or None."""
    for file, _ in stacks.get(ins.frame, []):
        for suffix, cls in SOURCES:
            if suffix in file:
                return cls
    return None


def _by_name(comps: dict[str, list[Instr]], comp: str) -> dict[str, Instr]:
    return {i.name: i for i in comps.get(comp, [])}


def dot_mkn(ins: Instr, scope: dict[str, Instr]) -> tuple[int, int, int, int]:
    """(batch, M, K, N) of a dot: batch = product of batch dims, K = product of contracting dims."""
    lhs = scope.get(ins.operands[0]) if ins.operands else None
    out = dims(ins.shape)
    ld = dims(lhs.shape) if lhs is not None else []

    def dimset(key):
        m = re.search(key + r"=\{([\d,]*)\}", ins.attrs)
        return [int(d) for d in m.group(1).split(",") if d] if m else []
    lc, lb = dimset("lhs_contracting_dims"), dimset("lhs_batch_dims")
    k = math.prod(ld[d] for d in lc) if ld else 1
    b = math.prod(ld[d] for d in lb) if ld else 1
    free_l = math.prod(ld[d] for d in range(len(ld)) if d not in lc and d not in lb) if ld else 1
    n = max(1, math.prod(out) // max(1, b * free_l))
    return b, free_l, k, n


def classify_matmul(b: int, m: int, k: int, n: int, vocab: int, batched: bool, source: str | None = None,
                    rank_rows: bool = True) -> str:
    """`rank_rows`: a dot with M ≤ LORA_MAX_RANK is a LoRA factor's (A's gradient as (ghᵀ x)ᵀ has M = the
    rank); off for decoding, where M is the batch's rows."""
    if vocab in (m, k, n):
        return "matmul: head"
    if batched or source == "attention":
        return "attention"
    if source == "LoRA routing / scale" or min(k, n) <= LORA_MAX_RANK or rank_rows and min(m, k) <= LORA_MAX_RANK:
        return "matmul: LoRA"
    return "matmul: projections"


def _walk(ins: Instr, comps: dict[str, list[Instr]], seen=None):
    """Every instruction of the computations `ins` calls, recursively (with each one's scope)."""
    seen = set() if seen is None else seen
    for c in ins.calls():
        if c in seen:
            continue
        seen.add(c)
        scope = _by_name(comps, c)
        for inner in comps.get(c, []):
            yield inner, scope
            yield from _walk(inner, comps, seen)


def classify_instr(ins: Instr, instrs: dict[str, Instr], comps: dict[str, list[Instr]], vocab: int,
                   stacks: dict[int, list[tuple[str, str]]] | None = None,
                   rank_rows: bool = True) -> tuple[str, float, tuple | None]:
    """(class, matmul FLOPs, (b, M, K, N) of its largest dot or None) of one executed instruction. A
    fusion with several dots is booked whole (time and FLOPs) to its largest dot's class."""
    stacks = stacks or {}
    body = [(ins, _by_name(comps, ins.computation))] if ins.opcode != "fusion" else list(_walk(ins, comps))
    if ins.opcode == "custom-call" or ins.opcode == "fusion" and not body:
        body = [(ins, _by_name(comps, ins.computation))]
    dots = [(i, sc) for i, sc in body if i.opcode == "dot"]
    if dots:
        flops, best, cls = 0.0, None, None
        for d, sc in dots:
            b, m, k, n = dot_mkn(d, sc)
            f = 2.0 * b * m * k * n
            flops += f
            if best is None or f > 2.0 * math.prod(best):
                best = (b, m, k, n)
                cls = classify_matmul(b, m, k, n, vocab, "lhs_batch_dims" in d.attrs,
                                      source_class(d, stacks) or source_class(ins, stacks), rank_rows)
        return cls, flops, best
    compute = [i for i, _ in body if i.opcode not in ("parameter", "constant", "get-tuple-element", "tuple")]
    if compute and {i.opcode for i in compute} <= _COPY_OPS:
        return "copies / layout", 0.0, None
    votes = collections.Counter(c for c in (source_class(i, stacks) for i in compute + [ins]) if c)
    if votes:
        return votes.most_common(1)[0][0], 0.0, None
    ops = {i.opcode for i, _ in body}
    if ops & {"exponential", "log"} and any(vocab in dims(i.shape) for i, _ in body):
        return "log-probs", 0.0, None
    return "elementwise / other", 0.0, None


def _events(trace_dir: str) -> list[dict]:
    path = glob.glob(f"{trace_dir}/**/perfetto_trace.json.gz", recursive=True)
    if not path:
        raise RuntimeError(f"jax.profiler wrote no perfetto trace under {trace_dir}")
    with gzip.open(path[0]) as f:
        d = json.load(f)
    return d["traceEvents"] if isinstance(d, dict) else d


def profile_xla(fn, hlo_text: str | list[str], runs: int, vocab: int, rank_rows: bool = True) -> dict:
    """Run `fn()` (blocking) `runs` times under the profiler; per-class ms per run. `hlo_text`: the
    compiled module of what `fn` runs, or a list of them (e.g. a prefill and a decode), each event
    joined to its own module's instructions by name."""
    import jax
    modules = {}
    for text in [hlo_text] if isinstance(hlo_text, str) else hlo_text:
        name = re.match(r"HloModule\s+([\w.\-]+)", text.strip())
        name = name.group(1) if name else None
        if name in modules:
            raise ValueError(f"profile_xla: two compiled modules named {name!r}: events could not tell them apart")
        modules[name] = _parse(text)
    with tempfile.TemporaryDirectory(prefix="dart_jax_profile_") as d:
        with jax.profiler.trace(d, create_perfetto_trace=True):
            t = time.perf_counter()
            for _ in range(runs):
                fn()
            profiled = (time.perf_counter() - t) / runs
        events = _events(d)
    per = collections.defaultdict(lambda: {"ms": 0.0, "flops": 0.0, "remat_ms": 0.0, "count": 0})
    shapes = collections.defaultdict(lambda: {"ms": 0.0, "flops": 0.0, "count": 0, "class": ""})
    unknown = 0.0
    elsewhere = collections.Counter()  # ms per run of the events of modules not given (by module name)
    cache = {}
    by_op = collections.Counter()
    for e in events:
        args = e.get("args") or {}
        op = args.get("hlo_op")
        if e.get("ph") != "X" or not op or e.get("name", "").startswith("end: "):
            continue
        module = args.get("hlo_module")
        if module not in modules:  # an event without its module's name: the one module profiled, if one
            module = next(iter(modules)) if len(modules) == 1 and (module is None or None in modules) else module
        instrs, comps, stacks = modules.get(module, ({}, {}, {}))
        ins = instrs.get(op)
        if ins is None:
            unknown += e.get("dur", 0.0) / 1e3
            elsewhere[str(module)] += e.get("dur", 0.0) / 1e3 / runs
            continue
        if ins.opcode in _CONTAINERS:
            continue
        key = (module, op)
        if key not in cache:
            cache[key] = classify_instr(ins, instrs, comps, vocab, stacks, rank_rows)
        ms = e.get("dur", 0.0) / 1e3
        _add(per, shapes, *cache[key], ms)
        if "rematted_computation" in ins.op_name:
            per[cache[key][0]]["remat_ms"] += ms
        if cache[key][2] is None:  # not a matmul: kept per instruction, for the busiest-ops table
            by_op[key] += ms
    top = []
    for (module, op), ms in by_op.most_common(TOP_OPS):
        instrs, comps, stacks = modules[module]
        top.append({"op": op, "class": cache[module, op][0], "ms": ms / runs,
                    "shape": instrs[op].shape.split("{")[0], "source": _where(instrs[op], instrs, comps, stacks)})
    return _summarise(per, shapes, runs, extra={"unmatched_ms": unknown / runs, "unmatched_modules": dict(elsewhere),
                                                 "top_other_ops": top, "profiled_wall_s": profiled})


def _where(ins: Instr, instrs, comps, stacks) -> str:
    """`file:function` of the innermost dart_jax frame behind `ins` (or its fused body's first), or ""."""
    for i in [ins] + [j for j, _ in _walk(ins, comps)]:
        for file, func in stacks.get(i.frame, []):
            if "dart_jax/" in file:
                return f"{file[file.index('dart_jax/'):]}:{func}"
    return ""


def _add(per, shapes, cls: str, flops: float, mkn: tuple | None, ms: float) -> None:
    """Count one executed op of class `cls` (and, for a matmul, its shape's row)."""
    rows = [per[cls]]
    if mkn is not None:
        rows.append(shapes[f"{mkn[0]}×{mkn[1]}×{mkn[2]}×{mkn[3]}" if mkn[0] > 1 else f"{mkn[1]}×{mkn[2]}×{mkn[3]}"])
        rows[1]["class"] = cls
    for r in rows:
        r["ms"] += ms
        r["flops"] += flops
        r["count"] += 1


def _summarise(per, shapes, runs: int, extra: dict | None = None) -> dict:
    total = sum(c["ms"] for c in per.values()) / runs
    classes = {}
    for cls in CLASSES:
        c = per.get(cls)
        if not c:
            continue
        ms = c["ms"] / runs
        classes[cls] = {"ms": ms, "share": ms / total if total else 0.0, "calls": c["count"] // runs,
                        "gflop": c["flops"] / runs / 1e9,
                        "gflops_per_s": (c["flops"] / runs) / (ms / 1e3) / 1e9 if c["flops"] and ms else None,
                        "remat_ms": c.get("remat_ms", 0.0) / runs}
    top = sorted(shapes.items(), key=lambda kv: -kv[1]["ms"])[:12]
    out = {"op_ms_per_update": total, "classes": classes,
           "matmul_shapes": [{"shape": k, "class": v["class"], "ms": v["ms"] / runs, "calls": v["count"] // runs,
                              "gflops_per_s": v["flops"] / (v["ms"] / 1e3) / 1e9 if v["ms"] else None}
                             for k, v in top]}
    out.update(extra or {})
    return out


_TORCH_MM = {"aten::mm", "aten::addmm", "aten::bmm", "aten::baddbmm"}
_TORCH_ATTN = ("scaled_dot_product", "flash_attention")
_TORCH_COPY = {"aten::copy_", "aten::clone", "aten::contiguous", "aten::cat", "aten::index", "aten::index_put_",
               "aten::slice_backward", "aten::fill_", "aten::zero_", "aten::zeros_like", "aten::empty_like",
               "aten::new_zeros", "aten::select_backward", "aten::_to_copy", "aten::expand", "aten::transpose"}
_TORCH_LABELS = {"dart::logprobs": "log-probs", "dart::loss": "loss", "dart::optimizer": "optimizer"}
_GRAD_FN = "autograd::engine::evaluate_function: "


def torch_context(ev) -> str | None:
    """The class an aten op inherits from where it ran: a `dart::` label of bench/train.py's update, or
    the backward function of a log-softmax / gather / SDPA."""
    cur = ev.cpu_parent
    while cur is not None:
        if cur.name in _TORCH_LABELS:
            return _TORCH_LABELS[cur.name]
        if cur.name.startswith(_GRAD_FN):
            fn = cur.name[len(_GRAD_FN):]
            if "LogSoftmax" in fn or "Gather" in fn:
                return "log-probs"
            if "ScaledDotProduct" in fn:
                return "attention"
            return None
        cur = cur.cpu_parent
    return None


def classify_torch(name: str, shapes: list, vocab: int, context: str | None = None,
                   rank_rows: bool = True) -> tuple[str, float, tuple | None]:
    if name in _TORCH_MM and shapes:
        arrs = [s for s in shapes if s]
        a, b = (arrs[-2], arrs[-1]) if len(arrs) >= 2 else (arrs[0], arrs[0])
        if name in ("aten::bmm", "aten::baddbmm"):
            bt, m, k, n = a[0], a[1], a[2], b[-1]
            return (classify_matmul(bt, m, k, n, vocab, bt > 1, context, rank_rows), 2.0 * bt * m * k * n,
                    (bt, m, k, n))
        m, k, n = a[0], a[-1], b[-1]
        return classify_matmul(1, m, k, n, vocab, False, context, rank_rows), 2.0 * m * k * n, (1, m, k, n)
    if any(t in name for t in _TORCH_ATTN):
        return "attention", 0.0, None
    if "log_softmax" in name or name in ("aten::gather", "aten::scatter", "aten::scatter_add_"):
        return "log-probs", 0.0, None
    if context:
        return context, 0.0, None
    if name in _TORCH_COPY:
        return "copies / layout", 0.0, None
    return "elementwise / other", 0.0, None


def profile_torch(step, runs: int, vocab: int, rank_rows: bool = True) -> dict:
    """Run the PyTorch update `step()` `runs` times under torch.profiler; per-class ms per run (self
    time of each aten op: a parent's children are not counted twice)."""
    import torch
    from torch.profiler import ProfilerActivity, profile
    with profile(activities=[ProfilerActivity.CPU], record_shapes=True) as prof:
        t = time.perf_counter()
        for _ in range(runs):
            step()
        profiled = (time.perf_counter() - t) / runs
    per = collections.defaultdict(lambda: {"ms": 0.0, "flops": 0.0, "count": 0, "remat_ms": 0.0})
    shapes = collections.defaultdict(lambda: {"ms": 0.0, "flops": 0.0, "count": 0, "class": ""})
    for ev in prof.events():
        if ev.device_type != torch.autograd.DeviceType.CPU or not ev.name.startswith("aten::"):
            continue  # labels and autograd's wrappers: their own time is bookkeeping, counted in wall − ops
        ms = ev.self_cpu_time_total / 1e3
        if ms <= 0:
            continue
        _add(per, shapes, *classify_torch(ev.name, list(ev.input_shapes or []), vocab, torch_context(ev), rank_rows),
             ms)
    return _summarise(per, shapes, runs, extra={"profiled_wall_s": profiled})


def bench_profile(model: str = "smollm2-135m-instruct", batch: int = 4, length: int = 512, runs: int = 2,
                  remat_policy: str = "none", with_torch: bool = True, logprob_chunk: int | None = None) -> dict:
    """The update of `launch.bench train`, profiled on both sides (plus each side's wall time per run)."""
    from dart_jax.bench.train import setup_update, update_flops
    u = setup_update(model, batch, length, remat_policy, logprob_chunk)
    hlo = u.step.lower(u.holder["state"], u.base, u.mb, u.key, 0).compile().as_text()
    for _ in range(2):  # compiled, and the state it returns (donated back in) settled
        u.ours()
    t = time.perf_counter()
    u.ours()
    wall = time.perf_counter() - t
    vocab = u.cfg.vocab_size
    out = {"bench": "profile", "model": model, "batch": batch, "length": length, "remat_policy": remat_policy,
           "logprob_chunk": u.lc.logprob_chunk, "runs": runs, "update_flops": update_flops(u.cfg, batch, length),
           "dart_jax": {"wall_s": wall, **profile_xla(u.ours, hlo, runs, vocab)}}
    if with_torch:
        from dart_jax.bench.train import _torch_update
        step = _torch_update("concat_2r", u.path, u.host_adapters, u.data, u.lc, u.oc)
        for _ in range(2):
            step()
        t = time.perf_counter()
        step()
        out["torch_concat_2r"] = {"wall_s": time.perf_counter() - t, **profile_torch(step, runs, vocab)}
    return out

