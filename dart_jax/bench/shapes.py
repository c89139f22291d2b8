"""The random-init model shapes the accelerator suite (bench.suite) and the rollout-mesh sweep
(bench.rollout_mesh, launch.sweep --rollout) build: Qwen2.5-3B's, and the same family scaled down for
CPU (`small`) and for the CI smoke (`tiny`)."""

from __future__ import annotations

from dart_jax.models.config import ModelConfig

# Qwen2.5-3B (config.json of Qwen/Qwen2.5-3B): the paper's main backbone
QWEN25_3B = dict(model_type="qwen2", vocab_size=151936, hidden_size=2048, intermediate_size=11008, num_layers=36,
                 num_heads=16, num_kv_heads=2, head_dim=128, rms_norm_eps=1e-6, rope_theta=1e6,
                 tie_word_embeddings=True, qkv_bias=True, max_position_embeddings=32768)
SHAPES = {
    "3b": dict(QWEN25_3B),
    # the same family and head layout (GQA 8:1, head_dim 128 → 64), scaled for 2 CPU cores
    "small": dict(QWEN25_3B, vocab_size=32000, hidden_size=512, intermediate_size=2752, num_layers=4, num_heads=8,
                  num_kv_heads=1, head_dim=64),
    "tiny": dict(QWEN25_3B, vocab_size=512, hidden_size=64, intermediate_size=176, num_layers=2, num_heads=4,
                 num_kv_heads=2, head_dim=16),
}


def model_config(shape: str, dtype: str = "bfloat16", **overrides) -> ModelConfig:
    """The ModelConfig of `shape` (SHAPES) with weights and compute in `dtype`, plus `overrides`."""
    if shape not in SHAPES:
        raise ValueError(f"suite shape {shape!r}; expected one of {sorted(SHAPES)}")
    return ModelConfig(**SHAPES[shape], param_dtype=dtype, compute_dtype=dtype, **overrides)
