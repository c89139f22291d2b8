"""ModelConfig: the static description of a decoder-only transformer, read from HF config.json.

One dataclass covers Llama 3.x, SmolLM2 (Llama architecture), Qwen2 / Qwen2.5 and Qwen3. It is
hashable so it can be a static argument of `jax.jit`.
"""

from __future__ import annotations

import dataclasses
import json
import os
from typing import Any, Mapping

import jax.numpy as jnp

SUPPORTED_MODEL_TYPES = ("llama", "qwen2", "qwen3")

ATTENTION_IMPLS = ("xla", "cudnn", "auto")

REMAT_POLICIES = ("none", "full", "dots", "dots_no_batch", "save_qkv_proj")


@dataclasses.dataclass(frozen=True)
class RopeScaling:
    """Llama-3 frequency scaling (rope_type "llama3"); `factor == 1` with no type means plain RoPE."""

    rope_type: str = "default"
    factor: float = 1.0
    low_freq_factor: float = 1.0
    high_freq_factor: float = 4.0
    original_max_position_embeddings: int = 8192


@dataclasses.dataclass(frozen=True)
class ModelConfig:
    model_type: str
    vocab_size: int
    hidden_size: int
    intermediate_size: int
    num_layers: int
    num_heads: int
    num_kv_heads: int
    head_dim: int
    rms_norm_eps: float = 1e-6
    rope_theta: float = 10000.0
    rope_scaling: RopeScaling = RopeScaling()
    tie_word_embeddings: bool = False
    qkv_bias: bool = False
    qk_norm: bool = False
    max_position_embeddings: int = 8192
    bos_token_id: int | None = None
    eos_token_ids: tuple[int, ...] = ()
    param_dtype: str = "float32"
    compute_dtype: str = "float32"
    remat_policy: str = "none"
    scan_layers: bool = True
    attention_impl: str = "xla"
    causal_block: int = 128  # "xla" attention without a cache: query blocks skip later keys (0 = off)
    cache_block: int = 128   # attention over a KV cache reads only its written blocks of this many slots (0 = all)

    def __post_init__(self):
        if self.model_type not in SUPPORTED_MODEL_TYPES:
            raise ValueError(
                f"unsupported architecture model_type={self.model_type!r}; "
                f"supported: {', '.join(SUPPORTED_MODEL_TYPES)}")
        if self.num_heads % self.num_kv_heads:
            raise ValueError(
                f"num_attention_heads={self.num_heads} is not a multiple of "
                f"num_key_value_heads={self.num_kv_heads}")
        if self.remat_policy not in REMAT_POLICIES:
            raise ValueError(f"remat_policy={self.remat_policy!r}; expected one of {REMAT_POLICIES}")
        if self.attention_impl not in ATTENTION_IMPLS:
            raise ValueError(f"attention_impl={self.attention_impl!r}; expected one of {ATTENTION_IMPLS}")
        for field in ("param_dtype", "compute_dtype"):
            if getattr(self, field) not in ("float32", "bfloat16", "float16"):
                raise ValueError(f"{field}={getattr(self, field)!r}; expected float32, bfloat16 or float16")

    @property
    def dtype(self):
        return jnp.dtype(self.compute_dtype)

    @property
    def weight_dtype(self):
        return jnp.dtype(self.param_dtype)

    def replace(self, **changes: Any) -> "ModelConfig":
        return dataclasses.replace(self, **changes)

    def num_params(self) -> int:
        d, f, h = self.hidden_size, self.intermediate_size, self.head_dim
        attn = d * h * (2 * self.num_heads + 2 * self.num_kv_heads)
        if self.qkv_bias:
            attn += h * (self.num_heads + 2 * self.num_kv_heads)
        if self.qk_norm:
            attn += 2 * h
        per_layer = attn + 3 * d * f + 2 * d
        head = 0 if self.tie_word_embeddings else self.vocab_size * d
        return self.num_layers * per_layer + self.vocab_size * d + head + d


def _rope_scaling_from_hf(cfg: Mapping[str, Any]) -> tuple[float, RopeScaling]:
    """Reads RoPE theta and scaling from either the classic (`rope_theta` + `rope_scaling`) or the
    transformers-5 (`rope_parameters`) layout of config.json."""
    params = dict(cfg.get("rope_parameters") or {})
    scaling = dict(cfg.get("rope_scaling") or {})
    merged = {**params, **scaling}
    theta = float(cfg.get("rope_theta", merged.get("rope_theta", 10000.0)))
    rope_type = merged.get("rope_type", merged.get("type", "default")) or "default"
    if rope_type == "default":
        return theta, RopeScaling()
    if rope_type != "llama3":
        raise ValueError(f"unsupported rope scaling type {rope_type!r}; supported: default, llama3")
    try:
        return theta, RopeScaling(
            rope_type="llama3",
            factor=float(merged["factor"]),
            low_freq_factor=float(merged["low_freq_factor"]),
            high_freq_factor=float(merged["high_freq_factor"]),
            original_max_position_embeddings=int(merged["original_max_position_embeddings"]),
        )
    except KeyError as e:
        raise ValueError(f"llama3 rope scaling is missing field {e.args[0]!r}") from None


def _eos_ids(value: Any) -> tuple[int, ...]:
    if value is None:
        return ()
    if isinstance(value, int):
        return (value,)
    return tuple(int(v) for v in value)


def config_from_hf_dict(cfg: Mapping[str, Any], **overrides: Any) -> ModelConfig:
    model_type = cfg.get("model_type")
    if model_type not in SUPPORTED_MODEL_TYPES:
        archs = cfg.get("architectures")
        raise ValueError(
            f"unsupported architecture model_type={model_type!r} (architectures={archs}); "
            f"supported: {', '.join(SUPPORTED_MODEL_TYPES)}")
    for key in ("vocab_size", "hidden_size", "intermediate_size", "num_hidden_layers",
                "num_attention_heads"):
        if key not in cfg:
            raise ValueError(f"config.json is missing required field {key!r}")
    if cfg.get("use_sliding_window"):
        raise ValueError("use_sliding_window=true is not supported (sliding-window attention)")
    theta, scaling = _rope_scaling_from_hf(cfg)
    num_heads = int(cfg["num_attention_heads"])
    head_dim = cfg.get("head_dim") or int(cfg["hidden_size"]) // num_heads
    if model_type == "llama":
        qkv_bias = bool(cfg.get("attention_bias", False))
        if cfg.get("mlp_bias"):
            raise ValueError("mlp_bias=true is not supported for llama")
    elif model_type == "qwen2":
        qkv_bias = True
    else:
        qkv_bias = bool(cfg.get("attention_bias", False))
    kwargs = dict(
        model_type=model_type,
        vocab_size=int(cfg["vocab_size"]),
        hidden_size=int(cfg["hidden_size"]),
        intermediate_size=int(cfg["intermediate_size"]),
        num_layers=int(cfg["num_hidden_layers"]),
        num_heads=num_heads,
        num_kv_heads=int(cfg.get("num_key_value_heads") or num_heads),
        head_dim=int(head_dim),
        rms_norm_eps=float(cfg.get("rms_norm_eps", 1e-6)),
        rope_theta=theta,
        rope_scaling=scaling,
        tie_word_embeddings=bool(cfg.get("tie_word_embeddings", False)),
        qkv_bias=qkv_bias,
        qk_norm=model_type == "qwen3",
        max_position_embeddings=int(cfg.get("max_position_embeddings", 8192)),
        bos_token_id=cfg.get("bos_token_id"),
        eos_token_ids=_eos_ids(cfg.get("eos_token_id")),
    )
    kwargs.update(overrides)
    return ModelConfig(**kwargs)


def config_from_hf_dir(path: str, **overrides: Any) -> ModelConfig:
    cfg_path = os.path.join(path, "config.json")
    if not os.path.isfile(cfg_path):
        raise FileNotFoundError(f"{cfg_path} not found: an HF model directory needs config.json")
    with open(cfg_path) as f:
        return config_from_hf_dict(json.load(f), **overrides)
