"""Loading the policy a run starts from — shared by the GRPO trainer and the SFT warm start.

    base model (+ the sentinel tags)
      └─ warm_start: a LoRA warm-start directory (launch.sft) merged into the base weights, the DART
         authors' pipeline: the role adapters then start on top of the warm-started model
          └─ adapters: `init_from` (an exported DART directory) or fresh (B = 0: the policy starts
             exactly at the warm-started model)

`init_from` also takes checkpoints written by the PyTorch systems: a DART authors' directory
(base + both concatenated adapters, `checkpoints/authors_io.py`), a PEFT LoRA directory (the
`lora` variant's shared adapter) and an HF model directory such as a verl / Search-R1 actor export
(`actor/huggingface`, or the output of verl's model merger), which replaces `model.path`.
"""

from __future__ import annotations

import json
import logging
import math
import os

import jax

from dart_jax.adapters.method import MethodSpec, init_adapters
from dart_jax.checkpoints.dart_io import MANIFEST, import_dart
from dart_jax.checkpoints.peft_io import merge_adapter
from dart_jax.checkpoints.registry import load_model, load_tagged_model
from dart_jax.data.paths import repo_path
from dart_jax.errors import UserError
from dart_jax.parallel.mesh import make_mesh

log = logging.getLogger(__name__)

# how tokens route to adapters, per method variant (the sampler's and the trainer's route mode)
ROUTE_MODE = {"dart": "role", "lora": "shared", "mixlora": "shared", "full": "none", "2agent": "none"}


def model_overrides(config) -> dict:
    """ModelConfig fields set by `config.model` (everything but the path; empty values skipped)."""
    fields = {k: v for k, v in dict(config.get("model", {})).items() if k != "path" and v not in (None, "")}
    return {k: tuple(v) if isinstance(v, list) else v for k, v in fields.items()}


def _manifest(path: str) -> dict:
    mpath = os.path.join(path, MANIFEST)
    if not os.path.isfile(mpath):
        raise FileNotFoundError(f"{mpath} not found: {path} is not an adapter directory written by "
                                "launch.train / launch.sft")
    with open(mpath) as f:
        return json.load(f)


def run_mesh(config):
    """The device mesh of `config.mesh.shape` (() = every device on the data axis)."""
    shape = tuple(config.mesh.shape) if config.mesh.shape else (jax.device_count(), 1, 1)
    if math.prod(shape) > jax.device_count():
        raise UserError(f"mesh.shape={shape} needs {math.prod(shape)} devices; {jax.device_count()} available: "
                        "set --config.mesh.shape to a shape whose product fits")
    return make_mesh(shape, jax.devices()[:math.prod(shape)])


def init_kind(path: str) -> str:
    """What an `init_from` directory holds: dart | authors | peft | hf."""
    from dart_jax.checkpoints.authors_io import is_authors_dir
    if not os.path.isdir(path):
        raise FileNotFoundError(f"init_from={path!r} is not a directory")
    if os.path.isfile(os.path.join(path, MANIFEST)):
        return "dart"
    if is_authors_dir(path):
        return "authors"
    if os.path.isfile(os.path.join(path, "adapter_config.json")):
        return "peft"
    if os.path.isfile(os.path.join(path, "config.json")):
        return "hf"
    raise FileNotFoundError(f"init_from={path!r}: no {MANIFEST} (DART directory), config.json with lora_r "
                            "(DART authors), adapter_config.json (PEFT) or config.json (HF model) in it")


def merge_warm_start(warm: str, base, cfg):
    """-> (base with the warm start's LoRA merged, W + s·A·B, and its tag rows; cfg; its tokenizer)."""
    merged, _, base, cfg, tok = import_dart(warm, base, cfg)
    for name in sorted(merged):
        base = merge_adapter(base, merged[name])
    log.info("warm start %s merged into the base (%s)", warm, ", ".join(sorted(merged)))
    return base, cfg, tok


def load_policy(config, method: MethodSpec, mesh, key: jax.Array):
    """-> (cfg, base, tokenizer, adapters or None) as `config` says (`warm_start`, `init_from`)."""
    overrides = model_overrides(config)
    warm = repo_path(config.get("warm_start", "") or "")
    init_from = repo_path(config.get("init_from", "") or "")
    kind = init_kind(init_from) if init_from else ""
    log.info("loading the policy: %s%s%s", config.model.path, f" + warm start {warm}" if warm else "",
             f" + init_from {init_from}" if init_from else "")
    if kind == "authors":
        from dart_jax.checkpoints.authors_io import import_authors
        if method.variant != "dart" or warm:
            raise UserError(f"init_from={init_from!r} is a DART authors' checkpoint (base + both adapters): it needs "
                             f"method.variant 'dart' (got {method.variant!r}) and no warm_start (got {warm!r})")
        cfg, base, adapters, spec, tok, _ = import_authors(init_from, mesh, **overrides)
        if tok is None:
            raise FileNotFoundError(f"{init_from}: no tokenizer saved with the checkpoint")
        if config.router.convention != spec.convention:
            log.warning("%s was trained with the authors' routing (convention %r); this run routes with %r "
                        "(--config.router.convention=authors to keep theirs)", init_from, spec.convention,
                        config.router.convention)
        return cfg, base, tok, adapters
    if kind == "hf":  # a full model (verl / Search-R1 actor export): it replaces model.path
        log.info("init_from=%s is an HF model directory: loading it instead of model.path=%s", init_from,
                 config.model.path)
        config = config.copy_and_resolve_references()
        config.model.path, config.init_from = init_from, ""
        return load_policy(config, method, mesh, key)
    if kind == "peft":
        from dart_jax.checkpoints.peft_io import import_peft
        if method.variant != "lora":
            raise UserError(f"init_from={init_from!r} is a PEFT LoRA directory: method.variant must be 'lora', "
                             f"got {method.variant!r}")
        config = config.copy_and_resolve_references()
        config.init_from = ""
        cfg, base, tok, _ = load_policy(config, method, mesh, key)
        return cfg, base, tok, {"shared": import_peft(init_from, cfg)}
    if init_from:
        if method.variant != "dart":
            raise UserError(f"init_from={init_from!r} is a DART adapter directory; method.variant must be "
                             f"'dart', got {method.variant!r}")
        wanted = _manifest(init_from).get("warm_start") or ""
        if os.path.abspath(repo_path(wanted) or ".") != os.path.abspath(warm or "."):
            raise UserError(f"init_from={init_from!r} was trained on top of warm_start={wanted!r}, but this run has "
                             f"warm_start={warm!r}: set --config.warm_start to the same directory")
    if warm:
        manifest = _manifest(warm)
        if manifest.get("kind") != "warm_start":
            raise UserError(f"warm_start={warm!r} is not a warm-start directory (kind={manifest.get('kind')!r}); "
                             "write one with `python -m launch.sft`")
    if not (warm or init_from):
        cfg, base, tok = load_tagged_model(config.model.path, jax.random.fold_in(key, 0), mesh, **overrides)
        return cfg, base, tok, init_adapters(method, cfg, jax.random.fold_in(key, 1))
    cfg, base = load_model(config.model.path, mesh=mesh, **overrides)
    tok = None
    if warm:
        base, cfg, tok = merge_warm_start(warm, base, cfg)
    if init_from:
        adapters, _, base, cfg, tok = import_dart(init_from, base, cfg)
    else:
        adapters = init_adapters(method, cfg, jax.random.fold_in(key, 1))
    return cfg, base, tok, adapters
