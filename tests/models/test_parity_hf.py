"""Logits of every model family vs PyTorch transformers (tiny random models, fp32, tol 1e-4)."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
import torch

from dart_jax.checkpoints.registry import load_model
from dart_jax.models.cache import init_cache
from dart_jax.models.generate import greedy_generate, left_pad
from dart_jax.models.transformer import forward

FAMILIES = ["llama", "qwen2", "qwen3"]
TOL = 1e-4  # fp32


def left_padded_batch(seed=0, lengths=(20, 15, 9), vocab=128):
    rng = np.random.default_rng(seed)
    prompts = [list(rng.integers(3, vocab, n)) for n in lengths]
    tokens, positions = left_pad(prompts, pad_id=0)
    return prompts, np.asarray(tokens), np.asarray(positions)


def torch_logits(model, tokens, positions):
    with torch.no_grad():
        return model(input_ids=torch.tensor(tokens, dtype=torch.long),
                     attention_mask=torch.tensor((positions >= 0).astype(np.int64)),
                     position_ids=torch.tensor(np.maximum(positions, 0), dtype=torch.long)).logits.numpy()


@pytest.mark.parametrize("family", FAMILIES)
def test_logits_match_transformers_left_padded(tiny_dirs, family):
    path, model = tiny_dirs[family]
    cfg, base = load_model(path)
    _, tokens, positions = left_padded_batch()
    ours, _ = forward(base, None, jnp.asarray(tokens), jnp.asarray(positions), None, None, cfg=cfg)
    ref = torch_logits(model, tokens, positions)
    valid = positions >= 0
    assert valid.sum() == 44
    np.testing.assert_allclose(np.asarray(ours)[valid], ref[valid], atol=TOL, rtol=0)


def test_llama3_rope_scaling_is_read_and_matters(tiny_dirs):
    path, model = tiny_dirs["llama"]
    cfg, base = load_model(path)
    assert cfg.rope_scaling.rope_type == "llama3" and cfg.rope_scaling.factor == 8.0
    _, tokens, positions = left_padded_batch()
    plain = cfg.replace(rope_scaling=type(cfg.rope_scaling)())
    ours, _ = forward(base, None, jnp.asarray(tokens), jnp.asarray(positions), None, None, cfg=plain)
    ref = torch_logits(model, tokens, positions)
    assert np.abs(np.asarray(ours) - ref)[positions >= 0].max() > 100 * TOL


@pytest.mark.parametrize("family,cache_block", [(f, 128) for f in FAMILIES] + [("qwen2", 8)])
def test_cached_chunks_equal_full_forward(tiny_dirs, family, cache_block):
    """Prefill in two chunks through the KV cache == one forward over all tokens (cache_block 8: the
    second chunk attends the cache's 3 written blocks of 8 out of 4, by the block loop)."""
    path, _ = tiny_dirs[family]
    cfg, base = load_model(path, cache_block=cache_block)
    _, tokens, positions = left_padded_batch(seed=1)
    full, _ = forward(base, None, jnp.asarray(tokens), jnp.asarray(positions), None, None, cfg=cfg)
    cache = init_cache(cfg, tokens.shape[0], 32)
    a, cache = forward(base, None, jnp.asarray(tokens[:, :12]), jnp.asarray(positions[:, :12]), None, cache, cfg=cfg)
    b, cache = forward(base, None, jnp.asarray(tokens[:, 12:]), jnp.asarray(positions[:, 12:]), None, cache, cfg=cfg)
    assert int(cache["index"]) == tokens.shape[1]
    chunked = np.concatenate([np.asarray(a), np.asarray(b)], axis=1)
    valid = positions >= 0
    np.testing.assert_allclose(chunked[valid], np.asarray(full)[valid], atol=1e-5, rtol=0)


@pytest.mark.parametrize("family,cache_block", [(f, 128) for f in FAMILIES] + [("llama", 4)])
def test_greedy_decode_matches_generate(tiny_dirs, family, cache_block):
    """cache_block 4: each decode step reads only the cache's written blocks (a loop of 5 to 9
    blocks of 4 slots over a 36-slot cache), the default reads the whole cache."""
    path, model = tiny_dirs[family]
    cfg, base = load_model(path, cache_block=cache_block)
    prompts, tokens, positions = left_padded_batch(seed=2)
    ours = np.asarray(greedy_generate(base, None, jnp.asarray(tokens), jnp.asarray(positions),
                                      cfg=cfg, max_new_tokens=16))
    for i, p in enumerate(prompts):
        with torch.no_grad():
            out = model.generate(torch.tensor([p]), attention_mask=torch.ones(1, len(p), dtype=torch.long),
                                 max_new_tokens=16, min_new_tokens=16, do_sample=False, pad_token_id=0)
        np.testing.assert_array_equal(ours[i], out[0, len(p):].numpy())


@pytest.mark.parametrize("switch", [dict(scan_layers=False), dict(remat_policy="full"),
                                    dict(remat_policy="dots"), dict(remat_policy="save_qkv_proj")])
def test_layer_scan_and_remat_switches_do_not_change_values_or_grads(tiny_dirs, switch):
    path, _ = tiny_dirs["qwen3"]
    cfg, base = load_model(path)
    other = cfg.replace(**switch)
    _, tokens, positions = left_padded_batch(seed=3)
    tokens, positions = jnp.asarray(tokens), jnp.asarray(positions)

    def loss(b, c):
        logits, _ = forward(b, None, tokens, positions, None, None, cfg=c)
        return jnp.mean(jax.nn.log_softmax(logits)[..., 5])

    v1, g1 = jax.value_and_grad(loss)(base, cfg)
    v2, g2 = jax.value_and_grad(loss)(base, other)
    np.testing.assert_allclose(v1, v2, rtol=1e-6)
    for x, y in zip(jax.tree_util.tree_leaves(g1), jax.tree_util.tree_leaves(g2)):
        np.testing.assert_allclose(np.asarray(x), np.asarray(y), atol=1e-6)


@pytest.mark.parametrize("family", FAMILIES)
def test_bf16_compute_close_to_fp32_reference(tiny_dirs, family):
    """bf16 params and compute: logits within bf16 tolerance of the fp32 torch model."""
    path, model = tiny_dirs[family]
    cfg, base = load_model(path, param_dtype="bfloat16", compute_dtype="bfloat16")
    assert base["layers"]["q"].dtype == jnp.bfloat16
    _, tokens, positions = left_padded_batch(seed=4)
    ours, _ = forward(base, None, jnp.asarray(tokens), jnp.asarray(positions), None, None, cfg=cfg)
    ref = torch_logits(model, tokens, positions)
    valid = positions >= 0
    err = np.abs(np.asarray(ours) - ref)[valid]
    scale = np.abs(ref[valid]).max()
    assert err.max() < 0.05 * scale, (err.max(), scale)
    assert (np.asarray(ours)[valid].argmax(-1) == ref[valid].argmax(-1)).mean() > 0.9


@pytest.mark.parametrize("block", [4, 7])
def test_causal_block_attention_matches_transformers_and_unblocked(tiny_dirs, block):
    """Query blocks that skip later keys (the training/prefill path) give transformers' logits on a
    left-padded batch whose length is not a multiple of the block, and the same gradients as the
    unblocked attention."""
    path, model = tiny_dirs["llama"]
    cfg, base = load_model(path, causal_block=block)
    cfg0, _ = load_model(path, causal_block=0)
    _, tokens, positions = left_padded_batch()
    t, p = jnp.asarray(tokens), jnp.asarray(positions)
    ours, _ = forward(base, None, t, p, None, None, cfg=cfg)
    valid = positions >= 0
    np.testing.assert_allclose(np.asarray(ours)[valid], torch_logits(model, tokens, positions)[valid], atol=TOL, rtol=0)

    def loss(b, c):
        return jnp.sum(jnp.where(p[..., None] >= 0, forward(b, None, t, p, None, None, cfg=c)[0], 0.0) ** 2) * 1e-3

    g_blocked = jax.grad(loss)(base, cfg)
    g_plain = jax.grad(loss)(base, cfg0)
    for a, b in zip(jax.tree.leaves(g_blocked), jax.tree.leaves(g_plain)):
        np.testing.assert_allclose(np.asarray(a), np.asarray(b), atol=1e-4, rtol=1e-4)


@pytest.mark.parametrize("dtype,tol,filled", [(jnp.float32, 1e-6, 37), (jnp.float32, 1e-6, 48),
                                              (jnp.bfloat16, 2e-2, 37)])
def test_filled_blocks_attention_reads_only_written_blocks(dtype, tol, filled):
    """The block loop equals attention over the whole cache (left-padded rows, GQA, a chunk of 3
    queries and a decode query), and never reads a block after the one holding the write index:
    those slots hold NaN here, which any read would spread through the matmul (the whole-cache
    attention's output is NaN, the block loop's is not). Unwritten slots in the last read block
    are zeros, as in a cache (created and grown with zeros)."""
    from dart_jax.models.attention import attention, attention_mask, filled_blocks_attention
    from dart_jax.models.config import ModelConfig
    rng = np.random.default_rng(0)
    b, kv, g, h, s, block = 3, 2, 3, 16, 64, 16  # filled 48: exactly three blocks
    cfg = ModelConfig(model_type="llama", vocab_size=8, hidden_size=kv * g * h, intermediate_size=8, num_layers=1,
                      num_heads=kv * g, num_kv_heads=kv, head_dim=h)
    k = rng.normal(size=(b, kv, h, s)).astype(np.float32)
    v = rng.normal(size=(b, kv, s, h)).astype(np.float32)
    pos = np.full((b, s), -1, np.int32)
    for row, pad in enumerate((0, 5, 20)):  # left padding: the first `pad` slots empty
        pos[row, pad:filled] = np.arange(filled - pad)
    k[..., filled:], v[:, :, filled:] = 0.0, 0.0
    k[..., 48:], v[:, :, 48:] = np.nan, np.nan  # after the third block of 16
    for t in (3, 1):  # the chunk's queries are the last t written slots
        q = jnp.asarray(rng.normal(size=(b, t, kv * g, h)), dtype)
        mask = attention_mask(jnp.asarray(pos[:, filled - t:filled]), jnp.asarray(pos))
        ours = filled_blocks_attention(q, jnp.asarray(k, dtype), jnp.asarray(v, dtype), mask, cfg,
                                       jnp.asarray(filled), block)
        whole = attention(q, jnp.asarray(k, dtype), jnp.asarray(v, dtype), mask, cfg, cache_layout=True)
        clean = attention(q, jnp.asarray(np.nan_to_num(k), dtype), jnp.asarray(np.nan_to_num(v), dtype), mask, cfg,
                          cache_layout=True)
        assert np.isnan(np.asarray(whole, np.float32)).all() and np.isfinite(np.asarray(ours, np.float32)).all()
        np.testing.assert_allclose(np.asarray(ours, np.float32), np.asarray(clean, np.float32), atol=tol, rtol=0)
