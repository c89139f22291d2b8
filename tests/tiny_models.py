"""Tiny random HF models for parity tests (built from transformers configs, saved to a temp dir)."""

from __future__ import annotations

import json
import os

import torch
import transformers
from safetensors.torch import load_file, save_file

COMMON = dict(vocab_size=128, hidden_size=64, intermediate_size=96, num_hidden_layers=2,
              num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=256,
              rms_norm_eps=1e-5, bos_token_id=1, eos_token_id=2, pad_token_id=0)


def llama_config(**kw):
    args = dict(COMMON, rope_theta=500000.0, tie_word_embeddings=False,
                rope_scaling={"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0,
                              "high_freq_factor": 4.0, "original_max_position_embeddings": 32})
    args.update(kw)
    return transformers.LlamaConfig(**args)


def qwen2_config(**kw):
    args = dict(COMMON, rope_theta=1000000.0, tie_word_embeddings=True)
    args.update(kw)
    return transformers.Qwen2Config(**args)


def qwen3_config(**kw):
    args = dict(COMMON, rope_theta=1000000.0, head_dim=24, tie_word_embeddings=False)
    args.update(kw)
    return transformers.Qwen3Config(**args)


FAMILIES = {"llama": llama_config, "qwen2": qwen2_config, "qwen3": qwen3_config}


def build(family: str, path: str, seed: int = 0, dtype=torch.float32, **kw):
    """Random model of `family` saved to `path`; returns the torch model (eval mode, fp32).
    Weights are drawn with std 0.2 (not HF's 0.02) so logits differ visibly between tokens."""
    torch.manual_seed(seed)
    cfg = FAMILIES[family](**kw)
    model = transformers.AutoModelForCausalLM.from_config(cfg).to(torch.float32)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if "norm" in name:
                p.copy_(1.0 + 0.1 * torch.randn_like(p))
            else:
                p.copy_(0.2 * torch.randn_like(p))
    model.eval()
    model.to(dtype).save_pretrained(path, safe_serialization=True)
    return model


AUTHORS_MODULES = ("self_attn.q_proj", "self_attn.k_proj", "self_attn.v_proj", "self_attn.o_proj", "mlp.gate_proj",
                   "mlp.up_proj", "mlp.down_proj")
AUTHORS_R, AUTHORS_ALPHA = 3, 12.0
AUTHORS_ENTER, AUTHORS_EXIT = 126, 127  # the added tags: the last two ids of the vocabulary


def write_authors_dir(path):
    """A tiny Qwen2 saved in the DART authors' layout (see dart_jax/checkpoints/authors_io.py), with random
    adapters; -> (torch model without adapters, {module prefix: (A [2r, in], B [out, 2r])})."""
    model = build("qwen2", path)
    weights = load_file(os.path.join(path, "model.safetensors"))
    g = torch.Generator().manual_seed(1)
    lora = {}
    for layer in range(model.config.num_hidden_layers):
        for mod in AUTHORS_MODULES:
            lin = model.get_submodule(f"model.layers.{layer}.{mod}")
            prefix = f"model.layers.{layer}.{mod}"
            lora[prefix] = (0.1 * torch.randn(2 * AUTHORS_R, lin.in_features, generator=g),
                            0.1 * torch.randn(lin.out_features, 2 * AUTHORS_R, generator=g))
            weights[f"{prefix}.lora_A.weight"], weights[f"{prefix}.lora_B.weight"] = lora[prefix]
    save_file({k: v.contiguous() for k, v in weights.items()}, os.path.join(path, "model.safetensors"),
              metadata={"format": "pt"})
    with open(os.path.join(path, "config.json")) as f:
        cfg = json.load(f)
    cfg.update(lora_r=AUTHORS_R, lora_alpha=AUTHORS_ALPHA, enter_tokens=[AUTHORS_ENTER],
               exit_tokens=[AUTHORS_EXIT])
    with open(os.path.join(path, "config.json"), "w") as f:
        json.dump(cfg, f)
    return model, lora
