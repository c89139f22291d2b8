"""The hand-written attention backward (models/attention.py `_grouped_softmax_attention`) against JAX
differentiating the textbook formula (KV heads repeated, einsum scores, softmax): values and the
gradients of q, k, v — grouped queries, left-padded rows (a padding query sees no key), the causal
query blocks of a training forward, fp32 and bf16."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from dart_jax.models.attention import attention, attention_mask, causal_blocked_attention
from dart_jax.models.config import ModelConfig

B, T, KV, G, H = 3, 13, 2, 3, 8


def textbook(q, k, v, mask):
    """q [B, T, N, H], k, v [B, S, K, H] -> [B, T, N, H], in fp32."""
    q, k, v = (a.astype(jnp.float32) for a in (q, k, v))
    k, v = jnp.repeat(k, G, axis=2), jnp.repeat(v, G, axis=2)
    s = jnp.einsum("btnh,bsnh->bnts", q, k) * H ** -0.5
    p = jax.nn.softmax(jnp.where(mask, s, jnp.finfo(jnp.float32).min), axis=-1)
    return jnp.einsum("bnts,bsnh->btnh", p, v)


@pytest.mark.parametrize("causal_block", [0, 4])
@pytest.mark.parametrize("dtype,tol", [(jnp.float32, 2e-5), (jnp.bfloat16, 3e-2)])
def test_attention_values_and_gradients_match_autodiff_of_the_textbook(causal_block, dtype, tol):
    """Tolerances: fp32 2e-5 absolute (values and gradients O(1)); bf16 inputs 3e-2 relative to the
    largest entry (bf16 keeps 8 bits of mantissa; p and the products are rounded to bf16 as the
    forward rounds them)."""
    rng = np.random.default_rng(3)
    cfg = ModelConfig(model_type="llama", vocab_size=8, hidden_size=KV * G * H, intermediate_size=8, num_layers=1,
                      num_heads=KV * G, num_kv_heads=KV, head_dim=H, causal_block=causal_block)
    pos = np.full((B, T), -1, np.int32)
    for row, pad in enumerate((0, 4, 9)):  # left padding: those queries see no key
        pos[row, pad:] = np.arange(T - pad)
    mask = attention_mask(jnp.asarray(pos), jnp.asarray(pos))
    q = jnp.asarray(rng.normal(size=(B, T, KV * G, H)), dtype)
    k = jnp.asarray(rng.normal(size=(B, T, KV, H)), dtype)
    v = jnp.asarray(rng.normal(size=(B, T, KV, H)), dtype)
    # the cotangent: on padding rows too, except with causal blocks, where a padding query's output (discarded
    # by every caller) is the mean of v over its block's keys rather than all keys
    valid = (pos >= 0)[:, :, None, None] if causal_block else np.ones((B, T, 1, 1), bool)
    w = jnp.asarray(rng.normal(size=(B, T, KV * G, H)) * valid, jnp.float32)

    def ours(q, k, v):
        o = causal_blocked_attention(q, k, v, mask, cfg) if causal_block else attention(q, k, v, mask, cfg)
        return o

    got_o, want_o = ours(q, k, v) * valid, textbook(q, k, v, mask[:, 0][:, None]) * valid
    assert got_o.dtype == dtype
    got = jax.grad(lambda *a: jnp.sum(ours(*a).astype(jnp.float32) * w), (0, 1, 2))(q, k, v)
    want = jax.grad(lambda *a: jnp.sum(textbook(*a, mask[:, 0][:, None]) * w), (0, 1, 2))(q, k, v)
    for g, e in [(got_o, want_o), *zip(got, want)]:
        g, e = np.asarray(g, np.float32), np.asarray(e, np.float32)
        assert g.shape == e.shape
        assert np.abs(g - e).max() <= tol * (1.0 if dtype == jnp.float32 else np.abs(e).max()), np.abs(g - e).max()
