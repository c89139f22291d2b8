"""fp32 master parameters under bf16 compute (verl's FSDP mixed precision): ten AdamW updates at
lr 1e-6 of the full variant with a bf16 base move the fp32 masters as an all-fp32 run does. Before
masters, the bf16 parameters took the update themselves and ~all of it rounded away (an lr-1e-6
step is far below a bf16 ulp at |θ| ≈ 0.1)."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from dart_jax.adapters.method import MethodSpec, init_adapters
from dart_jax.models.config import ModelConfig
from dart_jax.models.transformer import init_params
from dart_jax.rl.optim import make_optimizer
from dart_jax.rl.step import BATCH_KEYS, init_state, make_train_step
from dart_jax.run.spec import LossConfig, OptimConfig

CFG32 = ModelConfig(model_type="llama", vocab_size=64, hidden_size=32, intermediate_size=48, num_layers=2,
                    num_heads=4, num_kv_heads=2, head_dim=8, rope_theta=10000.0, rms_norm_eps=1e-5,
                    tie_word_embeddings=True, max_position_embeddings=128)
CFG16 = CFG32.replace(param_dtype="bfloat16", compute_dtype="bfloat16")


def _batch(n=4, t=16, seed=0):
    rng = np.random.default_rng(seed)
    tokens = rng.integers(0, 64, (n, t)).astype(np.int32)
    mask = np.zeros((n, t), np.float32)
    mask[:, 6:] = 1.0
    return {"tokens": tokens, "positions": np.tile(np.arange(t, dtype=np.int32), (n, 1)),
            "route_ids": np.full((n, t), -1, np.int32), "loss_roles": np.zeros((n, t), np.int32),
            "loss_mask": mask, "old_logp": rng.normal(-4.0, 0.3, (n, t)).astype(np.float32),
            "ref_logp": rng.normal(-4.0, 0.3, (n, t)).astype(np.float32),
            "advantages": np.array([1.0, -1.0, 0.5, -0.5], np.float32)}


def _train(cfg, base, params, method, batch=None, updates=10, lr=1e-6):
    oc = OptimConfig(lr=lr, warmup_steps=0, clip_norm=1.0)
    step = jax.jit(make_train_step(cfg, method, LossConfig(), oc))
    state = init_state(params, make_optimizer(oc))
    batch = {k: jnp.asarray(v)[None] for k, v in (batch or _batch()).items() if k in BATCH_KEYS}
    for k in range(updates):
        state, m = step(state, base, batch, jax.random.PRNGKey(k), k)
        assert float(m["skipped"]) == 0.0
    return state


def _flat(tree):
    return np.concatenate([np.asarray(x, np.float32).ravel() for x in jax.tree.leaves(tree)])


def test_full_variant_bf16_compute_moves_fp32_masters_like_fp32():
    base16 = jax.tree.map(lambda x: x.astype(jnp.bfloat16), init_params(CFG32, jax.random.PRNGKey(0)))
    theta0 = jax.tree.map(lambda x: x.astype(jnp.float32), base16)  # the same starting point for both runs
    method = MethodSpec(variant="full")
    s16 = _train(CFG16, base16, base16, method)
    s32 = _train(CFG32, theta0, theta0, method)
    assert {x.dtype for x in jax.tree.leaves(s16.params)} == {jnp.dtype(jnp.float32)}
    assert {x.dtype for x in jax.tree.leaves(s16.opt_state) if x.ndim} == {jnp.dtype(jnp.float32)}
    assert {x.dtype for x in jax.tree.leaves(s16.compute_params())} == {jnp.dtype(jnp.bfloat16)}
    d16, d32 = _flat(s16.params) - _flat(theta0), _flat(s32.params) - _flat(theta0)
    changed16, changed32 = np.mean(d16 != 0), np.mean(d32 != 0)
    # every component moves (Adam's early steps move each by ≈ lr; weight decay moves the rest)
    assert changed32 > 0.999 and changed16 > 0.999, (changed16, changed32)
    # ten sign-like Adam steps of ≈ 1e-6: the update vectors agree up to bf16 gradient noise, which
    # flips the sign of components whose gradient is near zero (measured: cos 0.997, rel 0.077)
    cos = float(d16 @ d32 / np.linalg.norm(d16) / np.linalg.norm(d32))
    rel = float(np.linalg.norm(d16 - d32) / np.linalg.norm(d32))
    assert cos > 0.98 and rel < 0.2, (cos, rel)
    assert np.abs(d32).max() == pytest.approx(1e-5, rel=0.2)  # ten steps of at most ≈ lr each


def test_bf16_adapters_train_through_fp32_masters():
    base = init_params(CFG32, jax.random.PRNGKey(0))
    method = MethodSpec(variant="dart", rank=4, alpha=8.0, adapter_dtype="bfloat16")
    ads = init_adapters(method, CFG32, jax.random.PRNGKey(1))
    ads = jax.tree.map(lambda x: (x + 0.05 * jax.random.normal(jax.random.PRNGKey(2), x.shape)).astype(x.dtype), ads)
    batch = _batch()
    batch["route_ids"] = np.where(np.arange(16) % 5 < 2, 1, 0).astype(np.int32)[None].repeat(4, 0)
    s = _train(CFG32, base, ads, method, batch)
    assert {x.dtype for x in jax.tree.leaves(ads)} == {jnp.dtype(jnp.bfloat16)}
    assert {x.dtype for x in jax.tree.leaves(s.params)} == {jnp.dtype(jnp.float32)}
    moved = _flat(s.params) - _flat(ads)
    assert np.mean(moved != 0) > 0.999
    # the same updates applied to the bf16 adapters themselves would vanish: lr·10 ≪ ulp(|a|) / 2
    lost = _flat(jax.tree.map(lambda x, m: m.astype(jnp.bfloat16).astype(jnp.float32), ads, s.params)) - _flat(ads)
    assert np.mean(lost != 0) < 0.1  # measured 0.053: only components with |a| ≲ 1e-4 keep it
