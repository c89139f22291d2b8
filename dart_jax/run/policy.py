"""Loading a policy — the GRPO trainer's, the SFT warm start's and every evaluation's (`load_policy`).

    base model (+ the sentinel tags)
      └─ warm_start: a LoRA warm-start directory (launch.sft) merged into the base weights, the DART
         authors' pipeline: the role adapters then start on top of the warm-started model
          └─ adapters: `init_from` (an exported DART directory) or fresh (B = 0: the policy starts
             exactly at the warm-started model)

What a reference is (`init_from`, evaluation's --checkpoint) is decided once, by run.source; this module
loads each kind. `init_from` also takes checkpoints written by the PyTorch systems: a DART authors'
directory (base + both concatenated adapters, `checkpoints/authors_io.py`), a PEFT LoRA directory (the
`lora` variant's shared adapter) and an HF model directory such as a verl / Search-R1 actor export
(`actor/huggingface`, or the output of verl's model merger), which replaces `model.path` (as a hub id,
a GGUF file or an embedded name does). A run's orbax checkpoint restores its trained tree
(`restore_trained`: the parameters only, not the optimiser state).
"""

from __future__ import annotations

import logging
import math
import os
from typing import Any

import jax
import jax.numpy as jnp

from dart_jax.adapters.method import MethodSpec, init_adapters, model_trees, trainable
from dart_jax.checkpoints.dart_io import MANIFEST, import_dart
from dart_jax.checkpoints.peft_io import merge_adapter
from dart_jax.checkpoints.registry import load_model, load_tagged_model
from dart_jax.data.paths import repo_path
from dart_jax.errors import UserError
from dart_jax.models.sharding import adapter_shardings, base_shardings
from dart_jax.parallel.mesh import make_mesh
from dart_jax.run.checkpoint import Checkpointer
from dart_jax.run.source import MODEL_KINDS, Source, classify_source

log = logging.getLogger(__name__)


def run_mesh(spec):
    """The device mesh of the spec's `mesh.shape` (() = every device on the data axis)."""
    shape = spec.mesh.resolved(jax.device_count())
    if math.prod(shape) > jax.device_count():
        raise UserError(f"mesh.shape={shape} needs {math.prod(shape)} devices; {jax.device_count()} available: "
                        "set --config.mesh.shape to a shape whose product fits")
    return make_mesh(shape, jax.devices()[:math.prod(shape)])


def merge_warm_start(warm: str, base, cfg):
    """-> (base with the warm start's LoRA merged, W + s·A·B, and its tag rows; cfg; its tokenizer)."""
    merged, _, base, cfg, tok = import_dart(warm, base, cfg)
    for name in sorted(merged):
        base = merge_adapter(base, merged[name])
    log.info("warm start %s merged into the base (%s)", warm, ", ".join(sorted(merged)))
    return base, cfg, tok


def _warm_start(warm: str) -> str:
    """`warm` checked to be a warm-start directory (-> itself)."""
    src = classify_source(warm) if os.path.isdir(warm) else None
    if src is None or src.kind not in ("dart", "warm_start"):
        raise FileNotFoundError(f"{os.path.join(warm, MANIFEST)} not found: {warm} is not an adapter directory "
                                "written by launch.train / launch.sft")
    if src.kind != "warm_start":
        raise UserError(f"warm_start={warm!r} is not a warm-start directory (kind={src.manifest.get('kind')!r}); "
                        "write one with `python -m launch.sft`")
    return src.path


INIT_KINDS = ("dart", "authors", "peft", "hf")  # what a run may start from (`init_from`)


def init_source(spec) -> Source | None:
    """What the spec's `init_from` is (None when unset): an exported DART adapter directory (or a run
    directory holding one), a DART authors' checkpoint, a PEFT LoRA directory or an HF model directory.
    A run's orbax checkpoints and warm starts are refused here: a warm start goes in `warm_start`, and
    a run's checkpoints are evaluated (`launch.evaluate --checkpoint`) or resumed (`--resume`)."""
    if not spec.init_from:
        return None
    init_from = repo_path(spec.init_from)
    if not os.path.isdir(init_from):
        raise FileNotFoundError(f"init_from={init_from!r} is not a directory")
    source = classify_source(init_from)
    if source.kind not in INIT_KINDS:
        hint = ("set --config.warm_start to it instead" if source.kind == "warm_start" else
                "resume that run with --resume, or export its adapters (launch.train writes adapters/ at the end)")
        raise UserError(f"init_from={init_from!r} holds {source.kind!r} ({source.path}); init_from takes an "
                        f"exported DART adapter directory, a DART authors' checkpoint, a PEFT LoRA directory or an "
                        f"HF model directory: {hint}")
    return source


def load_policy(spec, mesh, key: jax.Array, source: Source | None = None):
    """-> (cfg, base, tokenizer, adapters or None): `spec.model.path` with `spec.warm_start` merged and
    the adapters `source` holds (None: `spec.init_from`'s; neither: fresh, B = 0). A whole model (hf,
    hub, gguf, embedded) replaces model.path; a warm start replaces warm_start; an orbax checkpoint
    restores the run's trained tree (`restore_trained`) into the fresh policy of `spec.method`."""
    source = source if source is not None else init_source(spec)
    kind = source.kind if source is not None else ""
    method, overrides = spec.method, spec.model.overrides()
    model, warm = spec.model.path, repo_path(spec.warm_start or "")
    log.info("loading the policy: %s%s%s", model, f" + warm start {warm}" if warm else "",
             f" + {kind} {source.path}" if source is not None else "")
    if kind in MODEL_KINDS:  # a full model (a verl / Search-R1 actor export): it replaces model.path
        log.info("%s is a model (%s): loading it instead of model.path=%s", source.path, kind, model)
        return _load(source.path, warm, None, overrides, method, mesh, key)
    if kind == "authors":
        return _authors(spec, source.path, warm, mesh)
    if kind == "peft":
        if method.variant != "lora":
            raise UserError(f"init_from={source.path!r} is a PEFT LoRA directory: method.variant must be 'lora', "
                            f"got {method.variant!r}")
        from dart_jax.checkpoints.peft_io import import_peft
        cfg, base, tok, _ = _load(model, warm, None, overrides, method, mesh, key)
        return cfg, base, tok, {"shared": import_peft(source.path, cfg)}
    if kind == "warm_start":
        return _load(model, source.path, None, overrides, method, mesh, key)
    if kind == "dart":
        if method.variant != "dart":
            raise UserError(f"init_from={source.path!r} is a DART adapter directory; method.variant must be "
                            f"'dart', got {method.variant!r}")
        wanted = source.manifest.get("warm_start") or ""
        if os.path.abspath(repo_path(wanted) or ".") != os.path.abspath(warm or "."):
            raise UserError(f"init_from={source.path!r} was trained on top of warm_start={wanted!r}, but this run "
                            f"has warm_start={warm!r}: set --config.warm_start to the same directory")
        return _load(model, warm, source.path, overrides, method, mesh, key)
    policy = _load(model, warm, None, overrides, method, mesh, key)
    if kind == "orbax":
        cfg, base, tok, adapters = policy
        base, adapters, _ = restore_trained(method, cfg, base, adapters, source, mesh)
        return cfg, base, tok, adapters
    return policy


def _authors(spec, path: str, warm: str, mesh):
    """A DART authors' checkpoint: base + both adapters from one directory (their router convention)."""
    from dart_jax.checkpoints.authors_io import import_authors
    if spec.method.variant != "dart" or warm:
        raise UserError(f"init_from={path!r} is a DART authors' checkpoint (base + both adapters): it needs "
                        f"method.variant 'dart' (got {spec.method.variant!r}) and no warm_start (got {warm!r})")
    cfg, base, adapters, router, tok, _ = import_authors(path, mesh, **spec.model.overrides())
    if tok is None:
        raise FileNotFoundError(f"{path}: no tokenizer saved with the checkpoint")
    if spec.router_convention != router.convention:
        log.warning("%s was trained with the authors' routing (convention %r); this run routes with %r "
                    "(--config.router.convention=authors to keep theirs)", path, router.convention,
                    spec.router_convention)
    return cfg, base, tok, adapters


def _load(model: str, warm: str, dart: str | None, overrides: dict, method: MethodSpec, mesh, key: jax.Array):
    """`model` (+ the warm start `warm` merged) with the DART adapters of directory `dart`, else fresh."""
    warm = _warm_start(warm) if warm else ""  # before anything loads
    if not (warm or dart):
        cfg, base, tok = load_tagged_model(model, jax.random.fold_in(key, 0), mesh, **overrides)
        return cfg, base, tok, init_adapters(method, cfg, jax.random.fold_in(key, 1))
    cfg, base = load_model(model, mesh=mesh, **overrides)
    tok = None
    if warm:
        base, cfg, tok = merge_warm_start(warm, base, cfg)
    if dart:
        adapters, _, base, cfg, tok = import_dart(dart, base, cfg)
    else:
        adapters = init_adapters(method, cfg, jax.random.fold_in(key, 1))
    return cfg, base, tok, adapters


def restore_trained(method: MethodSpec, cfg, base, adapters, source: Source, mesh) -> tuple[Any, Any, int]:
    """-> (base, adapters, step) for the forward pass, with the trained tree of the orbax checkpoint
    `source` (its step, else the newest usable one) in place of the fresh one: only the parameters are
    read (the optimiser state stays on disk), as the fp32 masters and cast to the compute dtypes, as the
    trainer's `TrainState.compute_params` does. `adapters`/`base` must have the run's method's shapes."""
    if mesh is not None:
        base = jax.device_put(base, base_shardings(cfg, mesh))
    params = trainable(method, base, adapters)
    if mesh is not None and not method.trains_base:
        params = jax.device_put(params, adapter_shardings(params, cfg, mesh))
    masters = jax.tree.map(lambda x: jax.ShapeDtypeStruct(
        x.shape, jnp.float32 if jnp.issubdtype(x.dtype, jnp.floating) else x.dtype, sharding=x.sharding), params)
    ckpt = Checkpointer(source.path, keep=1_000_000)
    step = source.detail.get("step")
    like = {"train": {"params": masters}}
    try:
        if step is not None:
            if step not in ckpt.steps():
                raise FileNotFoundError(f"{source.path}: no checkpoint for step {step} (have {ckpt.steps()})")
            got = (step, *ckpt.restore(step, like, partial=True))
        else:
            got = ckpt.restore_latest(like, partial=True)
    finally:
        ckpt.close()
    if got is None:
        raise FileNotFoundError(f"{source.path}: no usable checkpoint (all missing, unfinished or corrupt)")
    step, tree, _ = got
    trained = jax.tree.map(lambda r, x: r if r.dtype == x.dtype else r.astype(x.dtype), tree["train"]["params"], params)
    base, adapters = model_trees(method, trained, base, None)
    log.info("restored step %d of %s", step, source.path)
    return base, adapters, int(step)
