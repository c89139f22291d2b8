"""Evaluating a run as it was trained: `launch.evaluate --checkpoint=RUN` without --config.

A run directory records how it was trained: `run_config.json` (the whole configuration, written by
run.run_dir when the run starts) and, in its exported `adapters/`, `dart_adapters.json` (the base
model's name and identity, the sentinel tags and router, the warm start). An evaluation of the run
takes from them everything that shapes a trajectory — the task, the base model with its dtypes and
remat, the method, the router, the rollout settings and the tool (retriever URL or index, corpus,
encoder, prefixes, top-k; SQL timeout) — so the numbers describe the policy that was trained, not
the evaluation defaults (configs/evaluate.py: the embedded SmolLM2 over the shipped 6.6k-passage
corpus). The tags come with the adapters' saved tokenizer. What an explicit --config, --model,
--task or --config.x changes relative to the run is listed (`differences`), and a base model that
does not match the adapters is refused before anything loads (`check_base`).

Where a run holds no run_config.json (an adapter directory copied on its own, a warm start), the
manifest's base model and warm start still apply; the rest are the evaluation defaults.
"""

from __future__ import annotations

import dataclasses
import json
import logging
import os
from typing import Callable

from dart_jax.checkpoints.dart_io import MANIFEST
from dart_jax.data.paths import repo_path
from dart_jax.errors import UserError
from dart_jax.run.run_dir import RUN_CONFIG, config_dict, flat, saved_config
from dart_jax.run.source import RUN_SUBDIRS

log = logging.getLogger(__name__)

# the config sections (or top-level fields) an evaluation takes from the run
AS_TRAINED = ("task", "model", "warm_start", "method", "router", "rollout", "retriever", "tool")
# sections that matter to one task only: differences elsewhere are not reported
TASK_ONLY = {"retriever": "qa", "tool": "sql"}


@dataclasses.dataclass(frozen=True)
class TrainedRun:
    """What a checkpoint path records about its training."""
    path: str                    # the checkpoint as given, resolved
    run_dir: str | None          # the directory holding run_config.json
    saved: dict | None           # run_config.json
    manifest_dir: str | None     # the adapter directory holding dart_adapters.json
    manifest: dict | None

    @property
    def task(self) -> str | None:
        return (self.saved or {}).get("task")

    @property
    def records(self) -> list[str]:
        """The files the settings come from."""
        return [name for name, have in ((RUN_CONFIG, self.saved), (MANIFEST, self.manifest)) if have is not None]

    @property
    def base(self) -> str | None:
        """The base model the adapters were trained on, by the name the run used."""
        return (self.manifest or {}).get("base_model") or ((self.saved or {}).get("model") or {}).get("path") or None


def locate(checkpoint: str) -> TrainedRun | None:
    """The run behind a run directory, its adapters/ or its checkpoints/ (None: a DART authors'
    checkpoint, which carries its own base, or a directory with no record of its training)."""
    from dart_jax.checkpoints.authors_io import is_authors_dir
    path = repo_path(checkpoint)
    if not os.path.exists(path):
        raise FileNotFoundError(f"--checkpoint {path} does not exist")
    if is_authors_dir(path):
        return None
    parent = os.path.dirname(os.path.normpath(path))
    owners = [path] + ([parent] if os.path.basename(os.path.normpath(path)) in RUN_SUBDIRS else [])
    run_dir = next((d for d in owners if os.path.isfile(os.path.join(d, RUN_CONFIG))), None)
    adapter_dirs = [path, os.path.join(path, "adapters")] + ([os.path.join(run_dir, "adapters")] if run_dir else [])
    manifest_dir = next((d for d in adapter_dirs if os.path.isfile(os.path.join(d, MANIFEST))), None)
    if run_dir is None and manifest_dir is None:
        return None
    manifest = None
    if manifest_dir:
        with open(os.path.join(manifest_dir, MANIFEST)) as f:
            manifest = json.load(f)
    return TrainedRun(path, run_dir, saved_config(run_dir) if run_dir else None, manifest_dir, manifest)


def _coerce(old, new):
    """A saved JSON value in the type of the config field it replaces (JSON has no tuples)."""
    if isinstance(old, tuple) and isinstance(new, list):
        return tuple(new)
    if isinstance(old, float) and isinstance(new, int) and not isinstance(new, bool):
        return float(new)
    return new


def adopt(config, run: TrainedRun) -> list[str]:
    """Set `config`'s AS_TRAINED fields to the run's (in place). -> saved fields this version of the
    config does not have (left out, named in the log)."""
    saved = run.saved or {}
    unknown = []
    for name in AS_TRAINED:
        if name not in saved:
            continue
        value = saved[name]
        if not isinstance(value, dict):
            config[name] = _coerce(config.get(name), value)
            continue
        for k, v in value.items():
            if k in config[name]:
                config[name][k] = _coerce(config[name][k], v)
            else:
                unknown.append(f"{name}.{k}")
    manifest = run.manifest or {}
    if not saved and manifest.get("base_model"):  # an adapter directory on its own
        config.model.path = manifest["base_model"]
        config.warm_start = manifest.get("warm_start") or ""
    if unknown:
        log.info("%s: saved settings this version does not know, left out: %s", run.run_dir, ", ".join(unknown))
    return unknown


def _show(v) -> str:
    return v if isinstance(v, str) and v else json.dumps(v)


def differences(as_run, config, origin: Callable[[str], str]) -> list[str]:
    """'field: run's X → Y (from ORIGIN)' for each AS_TRAINED field where `config` (what will be
    evaluated) differs from `as_run` (the evaluation defaults with the run's settings adopted);
    `origin(field)` names the flag that set it. Tool settings of the other task are not listed."""
    task = config.task
    run_flat = flat({k: v for k, v in config_dict(as_run).items() if k in AS_TRAINED})
    now_flat = flat({k: v for k, v in config_dict(config).items() if k in AS_TRAINED})
    out = []
    for key in sorted(run_flat.keys() | now_flat.keys()):
        section = key.split(".")[0]
        if TASK_ONLY.get(section, task) != task:
            continue
        a, b = run_flat.get(key, "<absent>"), now_flat.get(key, "<absent>")
        if a != b:
            out.append(f"{key}: run's {_show(a)} → {_show(b)} (from {origin(key)})")
    return out


def check_base(checkpoint: str, model_path: str) -> None:
    """Refuse (UserError, one line) a base model that is not the one the checkpoint's adapters were
    trained on: another architecture, vocabulary or size, or the same shapes with other weights.
    The reference is the identity the adapter manifest records (checkpoints/base_identity.py); a run
    written before manifests recorded it is compared with its recorded base when that resolves here."""
    from dart_jax.checkpoints.base_identity import base_mismatches, describe_base
    run = locate(checkpoint)
    if run is None:
        return
    trained_on = run.base
    recorded = (run.manifest or {}).get("base_config")
    if recorded is None and trained_on:
        try:
            recorded = describe_base(trained_on)
        except (OSError, ValueError):
            recorded = None
    if recorded is None:
        log.warning("%s records no base model that resolves here (%r): model.path=%s is not checked against it",
                    checkpoint, trained_on, model_path)
        return
    bad = base_mismatches(recorded, describe_base(model_path))
    if bad:
        raise UserError(f"model.path={model_path} is not the base model {checkpoint} was trained on ({trained_on}): "
                        f"{'; '.join(bad)}. Leave out --model / the model.path override to evaluate on the run's "
                        "base, or give a checkpoint trained on this model")
