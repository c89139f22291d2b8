"""Loading a model by name or path (an HF directory, a .gguf file, an embedded model name, or a
Hugging Face hub id found in the local cache: `models/names.py`), optionally with the protocol's
sentinel tags added (`load_tagged_model`)."""

from __future__ import annotations

import logging
import os
from typing import Any

import jax
from jax.sharding import Mesh

from dart_jax.checkpoints.gguf_import import GGUFSource
from dart_jax.checkpoints.loader import load_base
from dart_jax.checkpoints.sources import HFSource, TensorSource
from dart_jax.models.config import ModelConfig, config_from_hf_dir
from dart_jax.models.names import is_gguf, resolve
from dart_jax.models.sharding import base_shardings_flat
from dart_jax.models.transformer import Params
from dart_jax.parallel.mesh import DEFAULT_RULES, LogicalRules
from dart_jax.tokenization.sentinels import (
    SENTINEL_TAGS,
    add_sentinel_tokens,
    grow_embeddings,
    sentinel_ids,
)
from dart_jax.tokenization.tokenizer import load_tokenizer

log = logging.getLogger(__name__)

# Above this many parameters a model on jax's CPU backend is a missing accelerator install more often
# than a choice: the paper's models (3B and up) are far too slow to train or sample there.
CPU_WARN_PARAMS = 1_000_000_000
_cpu_warned = False


def warn_if_large_on_cpu(cfg: ModelConfig, name: str) -> bool:
    """Warns, once per process, when a model over CPU_WARN_PARAMS parameters is about to load on jax's
    CPU backend, which is what a plain `pip install -r requirements.txt` gives (its jaxlib is the CPU
    build): the warning names the accelerator install lines. -> whether it warned now."""
    global _cpu_warned
    if _cpu_warned or jax.default_backend() != "cpu" or cfg.num_params() <= CPU_WARN_PARAMS:
        return False
    _cpu_warned = True
    log.warning("%s has %.1fB parameters and jax runs on the CPU backend: training and sampling will be very "
                "slow. For NVIDIA GPUs: pip install -r requirements-cuda12.txt; for TPUs: "
                "pip install -r requirements-tpu.txt", name, cfg.num_params() / 1e9)
    return True


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
    warn_if_large_on_cpu(cfg, name_or_path)
    shardings = base_shardings_flat(cfg, mesh, rules) if mesh is not None else None
    return cfg, load_base(source, cfg, shardings)


def load_tagged_model(name_or_path: str, key, mesh=None, **overrides):
    """Model + tokenizer with the sentinel tags added and their embedding rows seeded: the
    starting point of every DART run. -> (cfg, base, tokenizer). `overrides` set ModelConfig
    fields (dtypes, remat, scan). A tag the checkpoint already has as one token with a row (a
    verl / DART run exported with its tags, Qwen3's native <think>) keeps its row: only tags added
    here, or without a row, are seeded."""
    path = resolve(name_or_path)
    cfg, base = load_model(name_or_path, mesh=mesh, **overrides)
    tok = load_tokenizer(path)
    added = set(add_sentinel_tokens(tok))
    ids = sentinel_ids(tok)
    seed = {t: w for t, w in SENTINEL_TAGS.items() if t in added or ids[t] >= cfg.vocab_size}
    kept = [t for t in SENTINEL_TAGS if t not in seed]
    if kept:
        log.info("%s: tags already in the vocabulary keep their rows: %s", path, kept)
    if seed or len(tok) > cfg.vocab_size:
        base, cfg = grow_embeddings(base, cfg, tok, seed, key)
    return cfg, base, tok
