"""What `launch.evaluate` evaluates: a base model, a warm start, a trained run, or imported adapters.

    --checkpoint DIR   a DART adapter directory (dart_adapters.json: kind "dart" → base + warm start
                       + routed adapters; kind "warm_start" → the warm-started base), a run directory
                       (its exported `adapters/`, else its newest usable orbax checkpoint), or a run's
                       `checkpoints/` directory (orbax; `step` picks one, default the newest that
                       verifies — a corrupt one falls back to the previous)
    --peft DIR         one PEFT LoRA directory, applied to every generated token (variant lora)
    neither            the model of `config.model.path` (+ `config.warm_start` when set), no adapters

A checkpoint's adapters are applied only to the base they were trained on: `config.model.path` is
checked against the identity the run recorded (eval.as_trained.check_base) before anything loads.

`remove` ("reasoning" | "tool") zeroes one role adapter at inference (DART-Reas keeps reasoning and
removes tool, DART-Tool the reverse: the paper's adapter-removal ablation): the removed role's tokens run the bare base.
"""

from __future__ import annotations

import dataclasses
import json
import logging
import os
from typing import Any

import jax
import jax.numpy as jnp

from dart_jax.adapters.method import MethodSpec, model_trees
from dart_jax.checkpoints.dart_io import MANIFEST
from dart_jax.data.paths import repo_path
from dart_jax.eval.as_trained import check_base
from dart_jax.models.lora import LoraAdapter
from dart_jax.run.policy import ROUTE_MODE, load_policy

log = logging.getLogger(__name__)

@dataclasses.dataclass
class Policy:
    cfg: Any
    base: Any
    tokenizer: Any
    adapters: dict | None
    route_mode: str
    source: dict  # what was loaded, for the report
    router_convention: str | None = None  # None: the config's (router.convention)


def _dart_dir(path: str) -> str | None:
    for d in (path, os.path.join(path, "adapters")):
        if os.path.isfile(os.path.join(d, MANIFEST)):
            return d
    return None


def _orbax_dir(path: str) -> str | None:
    for d in (path, os.path.join(path, "checkpoints")):
        if os.path.isdir(os.path.join(d, "integrity")):
            return d
    return None


def _method(config, variant: str) -> MethodSpec:
    from dart_jax.rl.sections import section
    return MethodSpec(**{**section(config, "method"), "variant": variant, "isolation": "forward",
                         "role_mask": "both"})


def remove_adapter(adapters: dict[str, LoraAdapter], name: str) -> dict[str, LoraAdapter]:
    """The same routed pair with adapter `name` contributing nothing (B = 0): its tokens run the base."""
    if name not in adapters:
        raise ValueError(f"cannot remove adapter {name!r}: the policy has {sorted(adapters)}")
    gone = adapters[name]
    zero = {t: {"a": ab["a"], "b": jnp.zeros_like(ab["b"])} for t, ab in gone.params.items()}
    return {**adapters, name: dataclasses.replace(gone, params=zero)}


def load_eval_policy(config, mesh, checkpoint: str | None = None, peft: str | None = None,
                     remove: str | None = None, step: int | None = None, seed: int = 0) -> Policy:
    key = jax.random.PRNGKey(seed)
    config = config.copy_and_resolve_references()
    source: dict = {"model": config.model.path, "warm_start": config.get("warm_start", "") or ""}
    if checkpoint and peft:
        raise ValueError("give --checkpoint or --peft, not both")
    if checkpoint:
        checkpoint = repo_path(checkpoint)
        if not os.path.exists(checkpoint):
            raise FileNotFoundError(f"--checkpoint {checkpoint} does not exist")
        from dart_jax.checkpoints.authors_io import is_authors_dir
        if is_authors_dir(checkpoint):
            return _from_authors(config, mesh, checkpoint, remove, source)
        check_base(checkpoint, config.model.path)  # a wrong base: one line, before anything loads
        dart = _dart_dir(checkpoint)
        orbax = _orbax_dir(checkpoint)
        if dart is None and orbax is None:
            raise FileNotFoundError(f"{checkpoint}: neither a DART adapter directory ({MANIFEST}), a run directory "
                                    "(adapters/ or checkpoints/), an orbax checkpoint directory nor a DART authors' "
                                    "checkpoint (config.json with lora_r / enter_tokens)")
        if dart is not None and step is None:
            return _from_dart(config, mesh, key, dart, remove, source)
        if orbax is None:
            raise FileNotFoundError(f"{checkpoint}: --step {step} needs the run's orbax checkpoints/")
        return _from_orbax(config, mesh, key, orbax, step, remove, source)
    if peft:
        from dart_jax.checkpoints.peft_io import import_peft
        method = _method(config, "full")
        cfg, base, tok, _ = load_policy(config, method, mesh, key)
        adapters = {"shared": import_peft(repo_path(peft), cfg)}
        if remove:
            raise ValueError("--remove-adapter needs a DART policy (two role adapters)")
        return Policy(cfg, base, tok, adapters, "shared", {**source, "peft": peft, "variant": "lora"})
    if remove:
        raise ValueError("--remove-adapter needs a DART policy: give --checkpoint")
    cfg, base, tok, _ = load_policy(config, _method(config, "full"), mesh, key)
    return Policy(cfg, base, tok, None, "none", {**source, "variant": "base"})


def _from_authors(config, mesh, path: str, remove: str | None, source: dict) -> Policy:
    """A checkpoint of the DART authors' code: base + both adapters from one directory, their router."""
    from dart_jax.checkpoints.authors_io import import_authors
    from dart_jax.run.policy import model_overrides
    cfg, base, adapters, spec, tok, meta = import_authors(path, mesh, **model_overrides(config))
    if tok is None:
        raise FileNotFoundError(f"{path}: evaluation needs the tokenizer saved with the checkpoint")
    if remove:
        adapters = remove_adapter(adapters, remove)
    return Policy(cfg, base, tok, adapters, "role", {**source, "model": path, "adapters": path, "variant": "dart",
                                                     "layout": "dart_authors", "removed": remove or "", **meta},
                  router_convention=spec.convention)


def _from_dart(config, mesh, key, path: str, remove: str | None, source: dict) -> Policy:
    with open(os.path.join(path, MANIFEST)) as f:
        manifest = json.load(f)
    if manifest.get("kind") == "warm_start":
        config.warm_start, config.init_from = path, ""
        cfg, base, tok, _ = load_policy(config, _method(config, "full"), mesh, key)
        if remove:
            raise ValueError("--remove-adapter: a warm start is merged into the base; it has no role adapters")
        return Policy(cfg, base, tok, None, "none", {**source, "warm_start": path, "variant": "warm_start"})
    wanted = manifest.get("warm_start") or ""
    if os.path.abspath(repo_path(wanted) or ".") != os.path.abspath(repo_path(config.get("warm_start", "") or ".")):
        log.info("%s was trained on warm_start=%r: using it (config had %r)", path, wanted, config.get("warm_start"))
    config.warm_start, config.init_from = wanted, path
    cfg, base, tok, adapters = load_policy(config, _method(config, "dart"), mesh, key)
    if remove:
        adapters = remove_adapter(adapters, remove)
    return Policy(cfg, base, tok, adapters, "role", {**source, "warm_start": wanted, "adapters": path,
                                                     "variant": "dart", "removed": remove or ""},
                  router_convention=manifest.get("router", {}).get("convention"))


# the method fields that decide the trained tree and how it is applied
METHOD_STRUCTURE = ("variant", "agent_params", "rank", "alpha", "targets", "rslora", "experts", "top_k",
                    "adapter_dtype")


def adopt_run_method(config, path: str) -> list[str]:
    """A checkpoint is evaluated as the method it was trained with: the structural method fields of
    the run's saved config (run_config.json beside the checkpoints) replace the evaluation config's
    (logged). Without this, two trees of the same shape — DART's routed pair and 2-Agent's two LoRAs
    — would restore into each other silently. -> the fields changed."""
    from dart_jax.run.run_dir import saved_config
    # `path` is the run's checkpoints/ (or a run directory): its run_config.json is beside it
    saved = (saved_config(path) or saved_config(os.path.dirname(os.path.normpath(path))) or {}).get("method") or {}
    changed = []
    for k in METHOD_STRUCTURE:
        if k not in saved or k not in config.method:
            continue
        old = config.method[k]
        new = type(old)(saved[k]) if isinstance(old, (tuple, list)) else saved[k]
        if new != old:
            config.method[k] = new
            changed.append(f"{k}: {old!r} → {new!r}")
    if changed:
        log.info("%s was trained with another method: using the run's (%s)", path, "; ".join(changed))
    return changed


def _from_orbax(config, mesh, key, path: str, step: int | None, remove: str | None, source: dict) -> Policy:
    """Rebuild the run's train state from its config and restore the trained tree into it."""
    from dart_jax.rl.optim import make_optimizer
    from dart_jax.rl.placement import place_state
    from dart_jax.rl.sections import method_spec, optim_config
    from dart_jax.run.checkpoint import Checkpointer

    adopt_run_method(config, path)
    method = method_spec(config)
    cfg, base, tok, adapters = load_policy(config, method, mesh, key)
    state, base = place_state(method, cfg, base, adapters, make_optimizer(optim_config(config)), mesh)
    ckpt = Checkpointer(path, keep=1_000_000)
    like = {"train": state, "rng": key}
    if step is not None:
        if step not in ckpt.steps():
            raise FileNotFoundError(f"{path}: no checkpoint for step {step} (have {ckpt.steps()})")
        got = (step, *ckpt.restore(step, like))
    else:
        got = ckpt.restore_latest(like)
    ckpt.close()
    if got is None:
        raise FileNotFoundError(f"{path}: no usable checkpoint (all missing, unfinished or corrupt)")
    step, tree, _ = got
    base, adapters = model_trees(method, tree["train"].compute_params(), base, None)
    if remove:
        if method.variant != "dart":
            raise ValueError(f"--remove-adapter needs a DART run; this one is {method.variant!r}")
        adapters = remove_adapter(adapters, remove)
    return Policy(cfg, base, tok, adapters, ROUTE_MODE[method.variant],
                  {**source, "checkpoint": path, "step": int(step), "variant": method.variant,
                   **({"agent_params": method.agent_params} if method.variant == "2agent" else {}),
                   "removed": remove or ""})
