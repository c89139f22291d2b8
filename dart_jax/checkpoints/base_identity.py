"""Which base model a set of adapters belongs to, told from the model's files without loading it.

Adapters trained on one base and applied to another fail late and obscurely (a shape error deep in
the restore) or, worse, run: Qwen2.5-7B and Qwen2.5-Coder-7B have the same shapes. `describe_base`
reads a base's architecture from its config (config.json or the GGUF header) and fingerprints its
weights by hashing a few small, evenly spaced slices of each weight file — milliseconds for a 7B
model, and two copies of the same files (a hub id and the snapshot directory it resolves to) give
the same fingerprint. The DART adapter manifest records it at export (`dart_io.export_dart`) and
evaluation compares it with the base it is about to load (`base_mismatches`).
"""

from __future__ import annotations

import hashlib
import json
import os

from dart_jax.models.names import is_gguf, resolve

# the architecture fields that decide whether adapters fit a base at all
ARCHITECTURE = ("model_type", "vocab_size", "hidden_size", "intermediate_size", "num_layers", "num_heads",
                "num_kv_heads", "head_dim")
SLICES, SLICE_BYTES = 16, 4096


def weight_files(path: str) -> list[str]:
    """The weight files of a resolved model path: the GGUF file, or an HF directory's safetensors."""
    if is_gguf(path):
        return [path]
    index = os.path.join(path, "model.safetensors.index.json")
    if os.path.isfile(index):
        with open(index) as f:
            names = sorted(set(json.load(f)["weight_map"].values()))
        return [os.path.join(path, n) for n in names]
    single = os.path.join(path, "model.safetensors")
    return [single] if os.path.isfile(single) else []


def weights_fingerprint(files: list[str]) -> str:
    """sha256 over each file's size and SLICES slices of SLICE_BYTES spread evenly over it (the
    safetensors / GGUF header, which names every tensor and shape, is the first slice)."""
    h = hashlib.sha256()
    for path in files:
        size = os.path.getsize(path)
        h.update(f"{os.path.basename(path)}:{size};".encode())
        with open(path, "rb") as f:
            for k in range(SLICES):
                f.seek(k * max(size - SLICE_BYTES, 0) // max(SLICES - 1, 1))
                h.update(f.read(SLICE_BYTES))
    return h.hexdigest()


def describe_base(name_or_path: str) -> dict:
    """{architecture fields..., "weights": fingerprint} of a model name or path (nothing is loaded)."""
    from dart_jax.checkpoints.registry import open_source
    path = resolve(name_or_path)
    _, cfg = open_source(path)
    out = {k: getattr(cfg, k) for k in ARCHITECTURE}
    files = weight_files(path)
    if files:
        out["weights"] = weights_fingerprint(files)
    return out


def base_mismatches(recorded: dict, actual: dict) -> list[str]:
    """'field recorded ≠ actual' for each architecture field that differs; when the architectures
    agree, whether the weights do (only fields both sides recorded are compared)."""
    out = [f"{k} {recorded[k]} ≠ {actual[k]}" for k in ARCHITECTURE
           if k in recorded and k in actual and recorded[k] != actual[k]]
    if not out and recorded.get("weights") and actual.get("weights") and recorded["weights"] != actual["weights"]:
        out.append("same architecture, other weights")
    return out
