"""Write a base tree back as an HF directory (config.json + model.safetensors).

The inverse of the import Views: each leaf (or layer slice) is transposed back and reshaped to its
torch-layout `raw` shape. Used for merged single-role checkpoints and for handing a GGUF-origin
model to PyTorch tools.
"""

from __future__ import annotations

import json
import os

import jax
import numpy as np
from safetensors.numpy import save_file

from dart_jax.checkpoints.sources import HF_LAYER, HF_TOP, views
from dart_jax.models.config import ModelConfig
from dart_jax.models.transformer import Params, flatten, param_shapes

_ARCH = {"llama": "LlamaForCausalLM", "qwen2": "Qwen2ForCausalLM", "qwen3": "Qwen3ForCausalLM"}


def hf_config_dict(cfg: ModelConfig) -> dict:
    d = {
        "architectures": [_ARCH[cfg.model_type]], "model_type": cfg.model_type,
        "vocab_size": cfg.vocab_size, "hidden_size": cfg.hidden_size,
        "intermediate_size": cfg.intermediate_size, "num_hidden_layers": cfg.num_layers,
        "num_attention_heads": cfg.num_heads, "num_key_value_heads": cfg.num_kv_heads,
        "head_dim": cfg.head_dim, "rms_norm_eps": cfg.rms_norm_eps, "rope_theta": cfg.rope_theta,
        "tie_word_embeddings": cfg.tie_word_embeddings,
        "max_position_embeddings": cfg.max_position_embeddings, "hidden_act": "silu",
        "torch_dtype": cfg.param_dtype,
    }
    if cfg.rope_scaling.rope_type == "llama3":
        rs = cfg.rope_scaling
        d["rope_scaling"] = {"rope_type": "llama3", "factor": rs.factor,
                             "low_freq_factor": rs.low_freq_factor, "high_freq_factor": rs.high_freq_factor,
                             "original_max_position_embeddings": rs.original_max_position_embeddings}
    if cfg.model_type == "llama":
        d["attention_bias"] = cfg.qkv_bias
        d["mlp_bias"] = False
    if cfg.bos_token_id is not None:
        d["bos_token_id"] = cfg.bos_token_id
    if cfg.eos_token_ids:
        d["eos_token_id"] = list(cfg.eos_token_ids) if len(cfg.eos_token_ids) > 1 else cfg.eos_token_ids[0]
    return d


def _to_raw(x: np.ndarray, view) -> np.ndarray:
    if view.perm is not None:
        inv = np.argsort(view.perm)
        x = x.transpose(inv)
    return np.ascontiguousarray(x.reshape(view.raw))


def base_to_hf_tensors(base: Params, cfg: ModelConfig) -> dict[str, np.ndarray]:
    vs = views(cfg)
    flat = flatten(base)
    out = {}
    for path in param_shapes(cfg):
        arr = np.asarray(jax.device_get(flat[path]))
        if path.startswith("layers/"):
            leaf = path.split("/", 1)[1]
            for layer in range(cfg.num_layers):
                out[f"model.layers.{layer}.{HF_LAYER[leaf]}"] = _to_raw(arr[layer], vs[path])
        else:
            out[HF_TOP[path]] = _to_raw(arr, vs[path])
    return out


def save_hf(base: Params, cfg: ModelConfig, out_dir: str, tokenizer=None) -> str:
    os.makedirs(out_dir, exist_ok=True)
    tensors = base_to_hf_tensors(base, cfg)
    save_file(tensors, os.path.join(out_dir, "model.safetensors"), metadata={"format": "pt"})
    with open(os.path.join(out_dir, "config.json"), "w") as f:
        json.dump(hf_config_dict(cfg), f, indent=2)
    if tokenizer is not None:
        tokenizer.save_pretrained(out_dir)
    return out_dir
