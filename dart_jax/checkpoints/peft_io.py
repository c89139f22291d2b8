"""PEFT-format adapters (adapter_config.json + adapter_model.safetensors), both directions, and
merging one adapter into the base for serving a single role.

PEFT keys: base_model.model.model.layers.{l}.{module}.lora_A.weight [r, in] and .lora_B.weight
[out, r] (torch layout); y = W x + s·B A x, s = alpha/r (alpha/√r with use_rslora).
"""

from __future__ import annotations

import json
import math
import os
import re

import jax
import jax.numpy as jnp
import numpy as np
from safetensors.numpy import save_file

from dart_jax.checkpoints.safetensors_mmap import SafetensorsFile
from dart_jax.models import lora as lora_lib
from dart_jax.models.config import ModelConfig
from dart_jax.models.transformer import Params

HF_MODULES = {"q": "self_attn.q_proj", "k": "self_attn.k_proj", "v": "self_attn.v_proj",
              "o": "self_attn.o_proj", "gate": "mlp.gate_proj", "up": "mlp.up_proj",
              "down": "mlp.down_proj"}
MODULE_TO_TARGET = {m.split(".")[-1]: t for t, m in HF_MODULES.items()}
_KEY = re.compile(r"^base_model\.model\.model\.layers\.(\d+)\.(self_attn|mlp)\.(\w+)"
                  r"\.lora_([AB])(?:\.[\w-]+)?\.weight$")


def _rank_alpha(adapter: lora_lib.LoraAdapter, rslora: bool) -> tuple[int, float]:
    r = adapter.rank
    return r, adapter.scale * (math.sqrt(r) if rslora else r)


def export_peft(adapter: lora_lib.LoraAdapter, cfg: ModelConfig, out_dir: str, rslora: bool = False,
                base_model_name_or_path: str | None = None, dtype: str = "float32") -> str:
    """One adapter -> a directory `PeftModel.from_pretrained` loads (weights stored as `dtype`:
    float32, or float16 to halve a shipped adapter)."""
    if dtype not in ("float32", "float16"):
        raise ValueError(f"PEFT export dtype={dtype!r}; expected 'float32' or 'float16'")
    os.makedirs(out_dir, exist_ok=True)
    rank, alpha = _rank_alpha(adapter, rslora)
    tensors = {}
    for target, ab in adapter.params.items():
        a = np.asarray(jax.device_get(ab["a"]), np.float32)
        b = np.asarray(jax.device_get(ab["b"]), np.float32)
        for layer in range(a.shape[0]):
            prefix = f"base_model.model.model.layers.{layer}.{HF_MODULES[target]}"
            tensors[f"{prefix}.lora_A.weight"] = np.ascontiguousarray(a[layer].reshape(-1, rank).T, dtype)
            tensors[f"{prefix}.lora_B.weight"] = np.ascontiguousarray(b[layer].reshape(rank, -1).T, dtype)
    save_file(tensors, os.path.join(out_dir, "adapter_model.safetensors"), metadata={"format": "pt"})
    config = {
        "peft_type": "LORA", "task_type": "CAUSAL_LM", "r": rank, "lora_alpha": alpha,
        "lora_dropout": adapter.dropout_rate, "use_rslora": rslora, "bias": "none",
        "fan_in_fan_out": False, "inference_mode": True, "init_lora_weights": True,
        "target_modules": sorted(HF_MODULES[t].split(".")[-1] for t in adapter.params),
        "base_model_name_or_path": base_model_name_or_path,
    }
    with open(os.path.join(out_dir, "adapter_config.json"), "w") as f:
        json.dump(config, f, indent=2)
    return out_dir


def import_peft(path: str, cfg: ModelConfig, dtype=jnp.float32) -> lora_lib.LoraAdapter:
    """A PEFT LoRA directory -> LoraAdapter. Fails naming the key or field that is wrong."""
    cfg_path = os.path.join(path, "adapter_config.json")
    weights = os.path.join(path, "adapter_model.safetensors")
    for p in (cfg_path, weights):
        if not os.path.isfile(p):
            raise FileNotFoundError(f"{p} not found: a PEFT adapter directory needs it")
    with open(cfg_path) as f:
        pc = json.load(f)
    if pc.get("peft_type") != "LORA":
        raise ValueError(f"{cfg_path}: peft_type={pc.get('peft_type')!r}, only LORA is supported")
    for unsupported in ("use_dora", "fan_in_fan_out"):
        if pc.get(unsupported):
            raise ValueError(f"{cfg_path}: {unsupported}=true is not supported")
    if pc.get("rank_pattern") or pc.get("alpha_pattern"):
        raise ValueError(f"{cfg_path}: per-module rank_pattern / alpha_pattern are not supported")
    rank, alpha = int(pc["r"]), float(pc["lora_alpha"])
    f = SafetensorsFile(weights)
    found: dict[str, dict[str, dict[int, np.ndarray]]] = {}
    for key in f.keys():
        m = _KEY.match(key)
        if not m:
            raise ValueError(f"{weights}: unexpected tensor {key!r} (expected decoder-layer lora_A/lora_B weights)")
        layer, _, module, ab = int(m.group(1)), m.group(2), m.group(3), m.group(4)
        if module not in MODULE_TO_TARGET:
            raise ValueError(f"{weights}: LoRA on unsupported module {module!r} in {key!r}")
        found.setdefault(MODULE_TO_TARGET[module], {}).setdefault(ab, {})[layer] = f.get(key)
    params = {}
    for target, ab in found.items():
        a, b = stack_torch_lora(cfg, target, ab, rank, weights)
        params[target] = {"a": jnp.asarray(a, dtype), "b": jnp.asarray(b, dtype)}
    if not params:
        raise ValueError(f"{weights}: no LoRA tensors")
    return lora_lib.LoraAdapter(params=params, scale=lora_lib.lora_scale(rank, alpha, bool(pc.get("use_rslora"))),
                                dropout_rate=float(pc.get("lora_dropout", 0.0)))


def stack_torch_lora(cfg: ModelConfig, target: str, ab: dict, rank: int, origin: str,
                     error: type[Exception] = ValueError) -> tuple[np.ndarray, np.ndarray]:
    """Per-layer torch-layout factors {"A": {layer: [r, in]}, "B": {layer: [out, r]}} -> our layer-stacked
    (a [L, *in, r], b [L, r, *out]) for `target`; a layer missing from either names itself."""
    in_shape, _, out_shape, _ = lora_lib.io_axes(cfg, target)
    for which in ("A", "B"):
        missing = sorted(set(range(cfg.num_layers)) - set(ab.get(which, {})))
        if missing:
            raise error(f"{origin}: lora_{which} of {HF_MODULES[target]} missing for layers {missing}")
    a = np.stack([np.asarray(ab["A"][layer], np.float32).T.reshape(*in_shape, rank)
                  for layer in range(cfg.num_layers)])
    b = np.stack([np.asarray(ab["B"][layer], np.float32).T.reshape(rank, *out_shape)
                  for layer in range(cfg.num_layers)])
    return a, b


def merge_adapter(base: Params, adapter: lora_lib.LoraAdapter) -> Params:
    """W' = W + s · A B in our layout (`tensordot(a, b)` is [L, *in, *out], the base leaf's shape)."""
    layers = dict(base["layers"])
    for target, ab in adapter.params.items():
        w = layers[target]
        delta = jax.vmap(lambda a, b: jnp.tensordot(a, b, axes=1))(
            ab["a"].astype(jnp.float32), ab["b"].astype(jnp.float32))
        layers[target] = (w.astype(jnp.float32) + adapter.scale * delta).astype(w.dtype)
    return {**base, "layers": layers}
