"""A DART adapter directory: both role adapters as PEFT directories plus what routing needs.

    DIR/dart_adapters.json               adapter names, router tags and convention, vocab size, the base
                                         model's name and identity (architecture + weight fingerprint:
                                         checkpoints/base_identity.py, so a wrong base is refused)
    DIR/<name>/                          one PEFT LoRA directory per adapter
    DIR/sentinel_embeddings.safetensors  rows of the added tag tokens (embed; lm_head when untied)
    DIR/tokenizer files                  the tokenizer with the tags added

Each role loads alone in PEFT (serve one role with `PeftModel.from_pretrained(base, DIR/<name>)`
after resizing the embeddings); `import_dart` restores the routed pair in dart_jax.
"""

from __future__ import annotations

import json
import os

import numpy as np
from safetensors.numpy import save_file

from dart_jax.checkpoints.peft_io import export_peft, import_peft
from dart_jax.checkpoints.safetensors_mmap import SafetensorsFile
from dart_jax.models.config import ModelConfig
from dart_jax.models.lora import LoraAdapter, adapter_names
from dart_jax.models.transformer import Params
from dart_jax.roles.router import RouterSpec
from dart_jax.tokenization.sentinels import sentinel_ids, set_token_rows, token_rows

MANIFEST = "dart_adapters.json"
ROWS = "sentinel_embeddings.safetensors"


def export_dart(out_dir: str, adapters: dict[str, LoraAdapter], cfg: ModelConfig, base: Params, tokenizer,
                open_tag: str = "<search>", close_tag: str = "</search>", convention: str = "dart_jax",
                tags: tuple[str, ...] | None = None, base_model: str | None = None, extra: dict | None = None,
                dtype: str = "float32") -> str:
    """`extra` adds fields to the manifest (kind, the warm start the adapters sit on, training stats).
    `base_model` (a name or path) is recorded with its identity (`base_config`) when it resolves here."""
    os.makedirs(out_dir, exist_ok=True)
    names = adapter_names(adapters)
    for name in names:
        export_peft(adapters[name], cfg, os.path.join(out_dir, name), base_model_name_or_path=base_model, dtype=dtype)
    ids = sentinel_ids(tokenizer, tags) if tags else sentinel_ids(tokenizer)
    rows = {n: t[list(ids.values())] for n, t in token_rows(base, cfg).items()}
    rows["ids"] = np.asarray(list(ids.values()), np.int64)
    save_file(rows, os.path.join(out_dir, ROWS))
    tokenizer.save_pretrained(out_dir)
    identity = _identity(base_model) if base_model else None
    manifest = {"adapters": list(names), "route_ids": {n: i for i, n in enumerate(names)},
                "router": {"open": [open_tag], "close": [close_tag], "convention": convention},
                "tags": list(ids), "vocab_size": cfg.vocab_size, "base_model": base_model,
                **({"base_config": identity} if identity else {}),
                **(extra or {})}
    with open(os.path.join(out_dir, MANIFEST), "w") as f:
        json.dump(manifest, f, indent=2)
    return out_dir


def _identity(base_model: str) -> dict | None:
    """The base's identity (base_identity.describe_base), or None when it does not resolve here."""
    from dart_jax.checkpoints.base_identity import describe_base
    try:
        return describe_base(base_model)
    except (OSError, ValueError):
        return None


def import_dart(path: str, base: Params, cfg: ModelConfig):
    """-> (adapters, RouterSpec, base with the tag rows, cfg with the grown vocab, tokenizer)."""
    import transformers
    mpath = os.path.join(path, MANIFEST)
    if not os.path.isfile(mpath):
        raise FileNotFoundError(f"{mpath} not found: not a DART adapter directory (see export_dart)")
    with open(mpath) as f:
        manifest = json.load(f)
    tokenizer = transformers.AutoTokenizer.from_pretrained(path)
    rows = SafetensorsFile(os.path.join(path, ROWS))
    ids = np.asarray(rows.get("ids"))
    names = ("embed",) if cfg.tie_word_embeddings else ("embed", "lm_head")
    missing = [n for n in names if n not in rows.keys()]
    if missing:
        raise ValueError(f"{path}: {ROWS} lacks rows for {missing} (the model's head is "
                         f"{'tied' if cfg.tie_word_embeddings else 'untied'})")
    base, cfg = set_token_rows(base, cfg, ids, {n: np.asarray(rows.get(n)) for n in names},
                               int(manifest["vocab_size"]))
    adapters = {n: import_peft(os.path.join(path, n), cfg) for n in manifest["adapters"]}
    r = manifest["router"]
    tid = sentinel_ids(tokenizer, tuple(r["open"]) + tuple(r["close"]))
    spec = RouterSpec(tuple(tid[t] for t in r["open"]), tuple(tid[t] for t in r["close"]), r["convention"])
    return adapters, spec, base, cfg, tokenizer
