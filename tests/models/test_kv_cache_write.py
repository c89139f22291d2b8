"""KV-cache writes (models.cache.write_layer; 16-bit keys through `_update_keys`'s integer view): the same
bits as a plain dynamic_update_slice, scalar and per-row indices; on XLA:CPU a bf16 model's decode program
holds no fp32 copy of a key buffer where the plain write has one (the float normalisation widened the
keys' whole buffer to fp32 and back on every write), and decodes the very same tokens and log-probs."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from dart_jax.models import cache as C


@pytest.mark.parametrize("dtype", ["bfloat16", "float16", "float32"])
@pytest.mark.parametrize("per_row", [False, True])
def test_write_layer_puts_the_chunk_where_a_plain_update_does(dtype, per_row):
    rng = np.random.default_rng(0)
    B, K, H, S, T = 3, 2, 8, 12, 2
    kb = jnp.asarray(rng.standard_normal((B, K, H, S)), dtype)
    vb = jnp.asarray(rng.standard_normal((B, K, S, H)), dtype)
    k, v = (jnp.asarray(rng.standard_normal((B, T, K, H)), jnp.float32) for _ in range(2))
    index = jnp.asarray([0, 5, 10], jnp.int32) if per_row else jnp.int32(4)
    got_k, got_v = jax.jit(C.write_layer)(kb, vb, k, v, index)
    want_k, want_v = np.asarray(kb).copy(), np.asarray(vb).copy()
    for b in range(B):
        i = int(index[b]) if per_row else int(index)
        want_k[b, :, :, i:i + T] = np.asarray(k[b].astype(dtype)).transpose(1, 2, 0)
        want_v[b, :, i:i + T, :] = np.asarray(v[b].astype(dtype)).transpose(1, 0, 2)
    assert got_k.dtype == kb.dtype and got_v.dtype == vb.dtype
    np.testing.assert_array_equal(np.asarray(got_k).view(np.uint8), want_k.view(np.uint8))  # bit for bit
    np.testing.assert_array_equal(np.asarray(got_v).view(np.uint8), want_v.view(np.uint8))
    assert (C._bits(jnp.dtype(dtype)) is not None) == (dtype != "float32" and jax.default_backend() == "cpu")


@pytest.mark.skipif(jax.default_backend() != "cpu", reason="the integer view is XLA:CPU's alone")
def test_a_bf16_decode_keeps_its_key_cache_in_bf16_and_decodes_what_the_plain_write_does(tmp_path, monkeypatch):
    import tiny_models
    from dart_jax.checkpoints.registry import load_model
    from dart_jax.models.transformer import per_layer_params
    from dart_jax.roles.router import RouterSpec
    from dart_jax.rollout.sampler import SamplerSpec, decode_segment, prefill
    from dart_jax.rollout.sampling import SamplingConfig

    tiny_models.build("llama", str(tmp_path), vocab_size=1000, hidden_size=128, intermediate_size=256,
                      num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=256, num_hidden_layers=2,
                      bos_token_id=1, eos_token_id=2, pad_token_id=2)
    cfg, base = load_model(str(tmp_path), param_dtype="bfloat16", compute_dtype="bfloat16")
    base = per_layer_params(base)
    b, t, new = 4, 8, 8
    prompt = jnp.asarray(np.random.default_rng(0).integers(10, 1000, (b, t)), jnp.int32)
    pos = jnp.broadcast_to(jnp.arange(t, dtype=jnp.int32), (b, t))
    out = {}
    for i, plain in enumerate((False, True)):
        if plain:  # the write as it was: a dynamic_update_slice of the bf16 buffer itself
            monkeypatch.setattr(C, "_bits", lambda dtype: None)
        never = 1007 + 10 * i  # a stop id no row samples (and another static spec: its own compiled programs)
        spec = SamplerSpec(cfg, RouterSpec((never + 1,), (never + 2,)), SamplingConfig(temperature=0.0), ((never,),),
                           "none")
        state, _ = prefill(base, None, prompt, pos, C.init_cache(cfg, b, t + new + 1), jax.random.PRNGKey(0),
                           spec=spec)
        full = "f32[" + ",".join(map(str, state.cache["k"][0].shape)) + "]"
        args = (jnp.ones((b,), bool), jnp.ones((b, 1), bool), jnp.full((b,), new, jnp.int32))
        text = decode_segment.lower(base, None, state, *args, spec=spec, length=new).compile().as_text()
        _, seg = decode_segment(base, None, state, *args, spec=spec, length=new)
        out[plain] = (full in text, np.asarray(seg.tokens), np.asarray(seg.logprobs))
    assert out[True][0] is True  # the plain write: XLA:CPU widens the key buffer (what the view is for)
    assert out[False][0] is False  # through the view: no fp32 copy of a key buffer in the decode program
    np.testing.assert_array_equal(out[False][1], out[True][1])
    np.testing.assert_array_equal(out[False][2], out[True][2])
