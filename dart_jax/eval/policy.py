"""What `launch.evaluate` evaluates: a base model, a warm start, a trained run, or imported adapters.

    --checkpoint REF   what run.source.classify_source makes of it: a DART adapter directory
                       (dart_adapters.json: kind "dart" → base + warm start + routed adapters; kind
                       "warm_start" → the warm-started base), a run directory (its exported
                       `adapters/`, else its newest usable orbax checkpoint), a run's `checkpoints/`
                       directory (orbax; `step` picks one, default the newest that verifies — a corrupt
                       one falls back to the previous), a DART authors' checkpoint, a PEFT LoRA, or a
                       whole model on disk (HF directory, GGUF file) in place of model.path (a hub id
                       or an embedded name goes in --config.model.path)
    --peft DIR         one PEFT LoRA directory, applied to every generated token (variant lora)
    neither            the model of `spec.model.path` (+ `spec.warm_start` when set), no adapters

Every one loads through run.policy.load_policy; an orbax checkpoint's trained tree is restored by
run.policy.restore_trained (parameters only) into the policy of the method the run was trained with.
A checkpoint's adapters are applied only to the base they were trained on: `spec.model.path` is
checked against the identity the run recorded (eval.as_trained.check_base) before anything loads.

`remove` ("reasoning" | "tool") zeroes one role adapter at inference (DART-Reas keeps reasoning and
removes tool, DART-Tool the reverse: the paper's adapter-removal ablation): the removed role's tokens run the bare base.
"""

from __future__ import annotations

import dataclasses
import logging
import os
from typing import Any

import jax
import jax.numpy as jnp

from dart_jax.adapters.method import MethodSpec
from dart_jax.data.paths import repo_path
from dart_jax.eval.as_trained import check_base
from dart_jax.models.lora import LoraAdapter
from dart_jax.run.policy import load_policy, restore_trained
from dart_jax.run.run_dir import saved_config
from dart_jax.run.source import MODEL_KINDS, Source, classify_source

log = logging.getLogger(__name__)


@dataclasses.dataclass
class EvalPolicy:
    """What an evaluation decodes with (rollout.compose.Policy is the decoder's view of one model)."""
    cfg: Any
    base: Any
    tokenizer: Any
    adapters: dict | None
    route_mode: str
    source: dict  # what was loaded, for the report
    router_convention: str | None = None  # None: the spec's (router.convention)


def _method(spec, variant: str) -> MethodSpec:
    return dataclasses.replace(spec.method, variant=variant, isolation="forward", role_mask="both")


def remove_adapter(adapters: dict[str, LoraAdapter], name: str) -> dict[str, LoraAdapter]:
    """The same routed pair with adapter `name` contributing nothing (B = 0): its tokens run the base."""
    if name not in adapters:
        raise ValueError(f"cannot remove adapter {name!r}: the policy has {sorted(adapters)}")
    gone = adapters[name]
    zero = {t: {"a": ab["a"], "b": jnp.zeros_like(ab["b"])} for t, ab in gone.params.items()}
    return {**adapters, name: dataclasses.replace(gone, params=zero)}


def load_eval_policy(spec, mesh, checkpoint: str | None = None, peft: str | None = None,
                     remove: str | None = None, step: int | None = None, seed: int = 0) -> EvalPolicy:
    """The policy `spec` (a run.spec.RunSpec) describes, with `checkpoint` (an existing path of any run.source kind) or
    `peft` (a PEFT LoRA directory) on it."""
    key = jax.random.PRNGKey(seed)
    record: dict = {"model": spec.model.path, "warm_start": spec.warm_start or ""}
    if checkpoint and peft:
        raise ValueError("give --checkpoint or --peft, not both")
    if peft:
        return _from_peft(spec, mesh, key, classify_source(repo_path(peft)), peft, remove, record)
    if not checkpoint:
        if remove:
            raise ValueError("--remove-adapter needs a DART policy: give --checkpoint")
        cfg, base, tok, _ = load_policy(dataclasses.replace(spec, method=_method(spec, "full")), mesh, key)
        return EvalPolicy(cfg, base, tok, None, "none", {**record, "variant": "base"})
    checkpoint = repo_path(checkpoint)
    if not os.path.exists(checkpoint):
        raise FileNotFoundError(f"--checkpoint {checkpoint} does not exist")
    source = classify_source(checkpoint, step)
    if source.kind == "authors":
        return _from_authors(spec, mesh, key, source, remove, record)
    check_base(checkpoint, spec.model.path)  # a wrong base: one line, before anything loads
    if source.kind == "orbax":
        return _from_orbax(spec, mesh, key, source, remove, record)
    if source.kind == "peft":
        return _from_peft(spec, mesh, key, source, checkpoint, remove, record)
    if source.kind in MODEL_KINDS:
        if remove:
            raise ValueError(f"--remove-adapter: {checkpoint} is a whole model ({source.kind}), without role "
                             "adapters")
        cfg, base, tok, _ = load_policy(dataclasses.replace(spec, method=_method(spec, "full")), mesh, key, source)
        return EvalPolicy(cfg, base, tok, None, "none", {**record, "model": source.path, "variant": "base"})
    return _from_dart(spec, mesh, key, source, remove, record)


def _from_peft(spec, mesh, key, source: Source, given: str, remove: str | None, record: dict) -> EvalPolicy:
    """One PEFT LoRA applied to every generated token (the lora variant's shared adapter)."""
    if remove:
        raise ValueError("--remove-adapter needs a DART policy (two role adapters)")
    cfg, base, tok, adapters = load_policy(dataclasses.replace(spec, method=_method(spec, "lora")), mesh, key, source)
    return EvalPolicy(cfg, base, tok, adapters, "shared", {**record, "peft": given, "variant": "lora"})


def _from_authors(spec, mesh, key, source: Source, remove: str | None, record: dict) -> EvalPolicy:
    """A checkpoint of the DART authors' code: base + both adapters from one directory, their router."""
    authors = dataclasses.replace(spec, method=_method(spec, "dart"), warm_start="", router_convention="authors")
    cfg, base, tok, adapters = load_policy(authors, mesh, key, source)
    meta = {"lora_r": source.detail["lora_r"], "lora_alpha": source.detail["lora_alpha"],
            "targets": sorted(adapters["tool"].params)}
    if remove:
        adapters = remove_adapter(adapters, remove)
    return EvalPolicy(cfg, base, tok, adapters, "role",
                      {**record, "model": source.path, "adapters": source.path, "variant": "dart",
                       "layout": "dart_authors", "removed": remove or "", **meta}, router_convention="authors")


def _from_dart(spec, mesh, key, source: Source, remove: str | None, record: dict) -> EvalPolicy:
    """An exported adapter directory: a warm start (merged into the base) or DART's routed pair on the
    warm start it was trained on."""
    if source.kind == "warm_start":
        if remove:
            raise ValueError("--remove-adapter: a warm start is merged into the base; it has no role adapters")
        cfg, base, tok, _ = load_policy(dataclasses.replace(spec, method=_method(spec, "full")), mesh, key, source)
        return EvalPolicy(cfg, base, tok, None, "none", {**record, "warm_start": source.path, "variant": "warm_start"})
    wanted = source.manifest.get("warm_start") or ""
    if os.path.abspath(repo_path(wanted) or ".") != os.path.abspath(repo_path(spec.warm_start or "") or "."):
        log.info("%s was trained on warm_start=%r: using it (spec had %r)", source.path, wanted, spec.warm_start)
    dart = dataclasses.replace(spec, method=_method(spec, "dart"), warm_start=wanted)
    cfg, base, tok, adapters = load_policy(dart, mesh, key, source)
    if remove:
        adapters = remove_adapter(adapters, remove)
    return EvalPolicy(cfg, base, tok, adapters, "role", {**record, "warm_start": wanted, "adapters": source.path,
                                                         "variant": "dart", "removed": remove or ""},
                      router_convention=source.manifest.get("router", {}).get("convention"))


# the method fields that decide the trained tree and how it is applied
METHOD_STRUCTURE = ("variant", "agent_params", "rank", "alpha", "targets", "rslora", "experts", "top_k",
                    "adapter_dtype")


def run_method(method: MethodSpec, path: str) -> MethodSpec:
    """A checkpoint is evaluated as the method it was trained with: the structural method fields of
    the run's saved config (run_config.json beside the checkpoints) replace `method`'s (logged).
    Without this, two trees of the same shape — DART's routed pair and 2-Agent's two LoRAs — would
    restore into each other silently."""
    # `path` is the run's checkpoints/ (or a run directory): its run_config.json is beside it
    saved = (saved_config(path) or saved_config(os.path.dirname(os.path.normpath(path))) or {}).get("method") or {}
    changed = {}
    for k in METHOD_STRUCTURE:
        if k not in saved:
            continue
        old = getattr(method, k)
        new = type(old)(saved[k]) if isinstance(old, (tuple, list)) else saved[k]
        if new != old:
            changed[k] = new
    if changed:
        log.info("%s was trained with another method: using the run's (%s)", path,
                 "; ".join(f"{k}: {getattr(method, k)!r} → {v!r}" for k, v in changed.items()))
    return dataclasses.replace(method, **changed)


def _from_orbax(spec, mesh, key, source: Source, remove: str | None, record: dict) -> EvalPolicy:
    """The run's policy (its method, `run_method`) with the trained tree of its orbax checkpoint."""
    method = run_method(spec.method, source.path)
    cfg, base, tok, adapters = load_policy(dataclasses.replace(spec, method=method), mesh, key)
    base, adapters, step = restore_trained(method, cfg, base, adapters, source, mesh)
    if remove:
        if method.variant != "dart":
            raise ValueError(f"--remove-adapter needs a DART run; this one is {method.variant!r}")
        adapters = remove_adapter(adapters, remove)
    return EvalPolicy(cfg, base, tok, adapters, method.route_mode,
                      {**record, "checkpoint": source.path, "step": step, "variant": method.variant,
                       **({"agent_params": method.agent_params} if method.variant == "2agent" else {}),
                       "removed": remove or ""})
