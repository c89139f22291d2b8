"""Tiny random HF models for parity tests (built from transformers configs, saved to a temp dir)."""

from __future__ import annotations

import torch
import transformers

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
