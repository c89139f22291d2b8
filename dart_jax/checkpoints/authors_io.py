"""Import a checkpoint written by the DART authors' PyTorch code (their custom Qwen2 module).

Their layout, one HF-style directory:

    config.json      the model config plus `lora_r` (rank per adapter), `lora_alpha`, `enter_tokens`
                     and `exit_tokens` (the tool span's opening / closing tag: ids or token strings)
    *.safetensors    the base weights (the vocabulary already holds the added tag tokens at its end)
                     and, per adapted linear, both adapters concatenated along the rank:
                         <module>.lora_A.weight  [2r, d_in]   (d_in → 2r)
                         <module>.lora_B.weight  [d_out, 2r]  (2r → d_out)
                     rank channels 0 … r−1 are the TOOL adapter, r … 2r−1 the REASONING adapter;
                     the base weight is <module>.weight (or <module>.base_layer.weight)
    tokenizer files  with the tags added

So y = W x + b + s · B[:, :r] A[:r] x on tool tokens and s · B[:, r:] A[r:] x on reasoning tokens,
s = lora_alpha / lora_r. Their router routes positions p_open+1 … p_close to the tool adapter
(docs/design.md, the router convention): the imported RouterSpec carries convention "authors", so
evaluation and training use their routing unless told otherwise. Names that differ from the above fail with the tensor
named (`AuthorsLayoutError`).
"""

from __future__ import annotations

import json
import os
import re

import jax.numpy as jnp
import numpy as np

from dart_jax.checkpoints.loader import load_base
from dart_jax.checkpoints.peft_io import HF_MODULES, MODULE_TO_TARGET, stack_torch_lora
from dart_jax.checkpoints.sources import HFSource
from dart_jax.models import lora as lora_lib
from dart_jax.models.config import config_from_hf_dir
from dart_jax.roles.router import RouterSpec

REQUIRED = ("lora_r", "lora_alpha", "enter_tokens", "exit_tokens")
_LORA = re.compile(r"^model\.layers\.(\d+)\.(self_attn|mlp)\.(\w+)\.lora_([AB])(?:\.weight)?$")


class AuthorsLayoutError(ValueError):
    pass


def is_authors_dir(path: str) -> bool:
    cfg = os.path.join(path, "config.json")
    if not os.path.isfile(cfg):
        return False
    with open(cfg) as f:
        raw = json.load(f)
    return all(k in raw for k in REQUIRED)


class AuthorsSource(HFSource):
    """The base weights of an authors' directory; their LoRA tensors are read separately."""

    def __init__(self, path: str):
        super().__init__(path)
        self.base_layer = any(n.endswith(".base_layer.weight") for n in self.names())

    def name(self, path: str, layer: int | None) -> str:
        n = super().name(path, layer)
        if self.base_layer and layer is not None and n.endswith(".weight"):
            alt = n[:-len(".weight")] + ".base_layer.weight"
            if alt in self.names():
                return alt
        return n

    def ignorable(self, name: str, cfg) -> bool:
        return super().ignorable(name, cfg) or bool(_LORA.match(name))


def _tag_ids(value, tokenizer, field: str, path: str) -> tuple[int, ...]:
    vals = value if isinstance(value, (list, tuple)) else [value]
    out = []
    for v in vals:
        if isinstance(v, int):
            out.append(v)
        elif isinstance(v, str) and tokenizer is not None:
            tid = tokenizer.convert_tokens_to_ids(v)
            if tid is None or tid == tokenizer.unk_token_id:
                raise AuthorsLayoutError(f"{path}/config.json: {field} token {v!r} is not in the tokenizer")
            out.append(int(tid))
        else:
            raise AuthorsLayoutError(f"{path}/config.json: {field} entry {v!r} must be a token id (or a token string "
                                     "with a tokenizer in the directory)")
    if not out:
        raise AuthorsLayoutError(f"{path}/config.json: {field} is empty")
    return tuple(out)


def import_authors(path: str, mesh=None, **overrides):
    """-> (cfg, base, adapters {"reasoning", "tool"}, RouterSpec (convention "authors"), tokenizer or None,
    meta {lora_r, lora_alpha, targets})."""
    with open(os.path.join(path, "config.json")) as f:
        raw = json.load(f)
    missing = [k for k in REQUIRED if k not in raw]
    if missing:
        raise AuthorsLayoutError(f"{path}/config.json lacks {missing}: not a DART authors' checkpoint")
    r, alpha = int(raw["lora_r"]), float(raw["lora_alpha"])
    cfg = config_from_hf_dir(path, **overrides)
    source = AuthorsSource(path)
    shardings = None
    if mesh is not None:
        from dart_jax.models.sharding import base_shardings_flat
        shardings = base_shardings_flat(cfg, mesh)
    base = load_base(source, cfg, shardings)
    found: dict[str, dict[str, dict[int, np.ndarray]]] = {}
    for name in sorted(source.names()):
        m = _LORA.match(name)
        if not m:
            continue
        layer, module, ab = int(m.group(1)), m.group(3), m.group(4)
        if module not in MODULE_TO_TARGET:
            raise AuthorsLayoutError(f"{path}: LoRA on unsupported module {module!r} ({name})")
        found.setdefault(MODULE_TO_TARGET[module], {}).setdefault(ab, {})[layer] = np.asarray(source.get(name),
                                                                                             np.float32)
    if not found:
        raise AuthorsLayoutError(f"{path}: no <module>.lora_A / lora_B tensors")
    halves = {"tool": slice(0, r), "reasoning": slice(r, 2 * r)}
    params: dict[str, dict] = {"tool": {}, "reasoning": {}}
    for target, ab in found.items():
        for layer in sorted(set(ab.get("A", {})) & set(ab.get("B", {}))):
            a, b = ab["A"][layer], ab["B"][layer]
            if a.shape[0] != 2 * r or b.shape[1] != 2 * r:
                raise AuthorsLayoutError(f"{path}: {HF_MODULES[target]} layer {layer}: lora_A {a.shape} / lora_B "
                                         f"{b.shape}, expected [2r={2 * r}, d_in] / [d_out, 2r] (both adapters "
                                         "concatenated)")
        for name, sl in halves.items():
            half = {"A": {layer: a[sl] for layer, a in ab.get("A", {}).items()},
                    "B": {layer: b[:, sl] for layer, b in ab.get("B", {}).items()}}
            A, B = stack_torch_lora(cfg, target, half, r, path, AuthorsLayoutError)
            params[name][target] = {"a": jnp.asarray(A), "b": jnp.asarray(B)}
    scale = alpha / r
    adapters = {n: lora_lib.LoraAdapter(params=p, scale=scale, dropout_rate=0.0) for n, p in params.items()}
    tokenizer = None
    if any(os.path.isfile(os.path.join(path, f)) for f in ("tokenizer.json", "tokenizer_config.json")):
        import transformers
        tokenizer = transformers.AutoTokenizer.from_pretrained(path)
    spec = RouterSpec(_tag_ids(raw["enter_tokens"], tokenizer, "enter_tokens", path),
                      _tag_ids(raw["exit_tokens"], tokenizer, "exit_tokens", path), "authors")
    return cfg, base, adapters, spec, tokenizer, {"lora_r": r, "lora_alpha": alpha, "targets": sorted(found)}
