"""A tiny random llama-shaped model with DART adapters (two routed rank-4 LoRAs, B made non-zero so
both adapters matter): the fixture of the train-step tests (tests/rl/)."""

import jax

from dart_jax.adapters.method import MethodSpec, init_adapters
from dart_jax.models.config import ModelConfig
from dart_jax.models.transformer import init_params

CFG = ModelConfig(model_type="llama", vocab_size=64, hidden_size=32, intermediate_size=48, num_layers=2,
                  num_heads=4, num_kv_heads=2, head_dim=8, rope_theta=10000.0, rms_norm_eps=1e-5,
                  tie_word_embeddings=True, max_position_embeddings=128)


def dart_setup():
    """-> (base, method, adapters) on CFG."""
    base = init_params(CFG, jax.random.PRNGKey(0))
    method = MethodSpec(variant="dart", rank=4, alpha=8.0)
    adapters = init_adapters(method, CFG, jax.random.PRNGKey(1))
    adapters = jax.tree.map(lambda x: x + 0.05 * jax.random.normal(jax.random.PRNGKey(2), x.shape), adapters)
    return base, method, adapters
