"""The jitted GRPO update on a tiny random model: micro-batch accumulation, verl's per-micro-batch
mean, non-finite skipping, AdamW + schedule (on verl's RL-step clock) against torch.optim.AdamW."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
import torch

from dart_jax.adapters.method import MethodSpec
from dart_jax.rl import losses
from dart_jax.rl.optim import apply_update, clock as clock_of, learning_rate, make_optimizer
from dart_jax.rl.step import BATCH_KEYS, init_state, make_scorer, make_train_step
from dart_jax.run.spec import LossConfig, OptimConfig
from tiny_dart import CFG, dart_setup


def _batch(n=4, t=12, seed=0):
    rng = np.random.default_rng(seed)
    tokens = rng.integers(0, 64, (n, t)).astype(np.int32)
    positions = np.tile(np.arange(t, dtype=np.int32), (n, 1))
    positions[1, :3] = -1  # a left-padded row
    mask = np.zeros((n, t), np.float32)
    mask[:, 5:] = 1.0
    mask[2, 5:9] = 0.0
    routes = np.where(np.arange(t) % 5 < 2, 1, 0).astype(np.int32)[None].repeat(n, 0)
    routes[positions < 0] = -1
    lroles = np.concatenate([np.full((n, 1), -1), routes[:, :-1]], 1).astype(np.int32)
    return {"tokens": tokens, "positions": positions, "route_ids": routes, "loss_roles": lroles, "loss_mask": mask,
            "advantages": rng.normal(size=n).astype(np.float32)}


def _with_logps(batch, base, adapters, lc):
    score = jax.jit(make_scorer(CFG, lc.temperature, lc.logprob_chunk))
    args = [jnp.asarray(batch[k]) for k in ("tokens", "positions", "route_ids")]
    old = np.asarray(score(base, adapters, *args))
    ref = np.asarray(score(base, None, args[0], args[1], None))
    # perturb old log-probs so ratios differ from 1 and clipping engages
    old = old + np.random.default_rng(1).normal(0, 0.3, old.shape).astype(np.float32)
    return dict(batch, old_logp=old, ref_logp=ref)


def _split(batch, m):
    return {k: jnp.asarray(batch[k]).reshape((m, -1) + batch[k].shape[1:]) for k in BATCH_KEYS}


@pytest.fixture(scope="module")
def setup():
    return dart_setup()


def _run(setup, lc, m, batch=None, optim=OptimConfig(lr=1e-3, warmup_steps=0)):
    base, method, adapters = setup
    batch = batch if batch is not None else _with_logps(_batch(), base, adapters, lc)
    opt = make_optimizer(optim)
    step = jax.jit(make_train_step(CFG, method, lc, optim))
    state, metrics = step(init_state(adapters, opt), base, _split(batch, m), jax.random.PRNGKey(0), 0)
    return state, metrics, batch


@pytest.mark.parametrize("mode", ["token-mean", "seq-mean-token-mean"])
def test_global_mode_is_invariant_to_micro_batching(setup, mode):
    lc = LossConfig(agg_mode=mode, kl_coef=0.01, entropy_coef=0.01)
    # Adam's first update is lr·g/(|g| + eps): with eps 1e-8 a gradient entry near zero whose last bits
    # differ between summation orders (fp32 accumulation across micro-batches) can move by up to 2·lr.
    # eps 1e-3 keeps the update Lipschitz in g (constant lr/eps = 1), so 2e-6 bounds real differences.
    optim = OptimConfig(lr=1e-3, warmup_steps=0, eps=1e-3)
    s1, m1, batch = _run(setup, lc, 1, optim=optim)
    s2, m2, _ = _run(setup, lc, 2, batch, optim=optim)
    s4, m4, _ = _run(setup, lc, 4, batch, optim=optim)
    for a, b in ((s1, s2), (s1, s4)):
        for x, y in zip(jax.tree.leaves(a.params), jax.tree.leaves(b.params)):
            np.testing.assert_allclose(np.asarray(x), np.asarray(y), atol=2e-6)
    assert float(m1["loss"]) == pytest.approx(float(m4["loss"]), rel=1e-5, abs=1e-7)
    assert float(m1["grad_norm"]) == pytest.approx(float(m4["grad_norm"]), rel=1e-5)


def test_loss_value_matches_numpy_recomputation(setup):
    """The step's loss = token-mean of pg + kl_coef·k3 − entropy_coef·H, recomputed in numpy from the
    same teacher-forced log-probs."""
    base, method, adapters = setup
    lc = LossConfig(kl_coef=0.05, entropy_coef=0.02)
    _, m, batch = _run(setup, lc, 2)
    logp = np.asarray(jax.jit(make_scorer(CFG, 1.0, 256))(base, adapters, *(jnp.asarray(batch[k]) for k in
                                                                            ("tokens", "positions", "route_ids"))))
    a = batch["advantages"][:, None]
    ratio = np.exp(np.clip(logp - batch["old_logp"], -20, 20))
    lclip = np.maximum(-a * ratio, -a * np.clip(ratio, 0.8, 1.2))
    pg = np.where(a < 0, np.minimum(-a * 3.0, lclip), lclip)
    u = np.clip(batch["ref_logp"] - logp, -20, 20)
    kl = np.clip(np.exp(u) - u - 1, -10, 10)
    mask = batch["loss_mask"]
    expect_pg = (pg * mask).sum() / mask.sum()
    expect_kl = (kl * mask).sum() / mask.sum()
    assert float(m["pg_loss"]) == pytest.approx(expect_pg, rel=1e-4, abs=1e-6)
    assert float(m["kl"]) == pytest.approx(expect_kl, rel=1e-4, abs=1e-7)
    assert float(m["loss"]) == pytest.approx(expect_pg + 0.05 * expect_kl - 0.02 * float(m["entropy"]), rel=1e-4)


def test_verl_microbatch_mean_differs_and_equals_mean_of_micro_losses(setup):
    base, method, adapters = setup
    lc_g = LossConfig(micro_mode="global")
    lc_v = LossConfig(micro_mode="verl_microbatch_mean")
    _, mg, batch = _run(setup, lc_g, 2)
    _, mv, _ = _run(setup, lc_v, 2, batch)
    halves = [_run(setup, lc_g, 1, {k: v[i * 2:(i + 1) * 2] for k, v in batch.items()})[1] for i in range(2)]
    assert float(mv["loss"]) == pytest.approx(np.mean([float(h["loss"]) for h in halves]), rel=1e-5)
    # global = the token-weighted mean of the halves, verl = their plain mean: the micro-batches hold
    # different token counts (row 2 has 4 masked tokens), so the two differ by exactly that weighting
    counts = [float(batch["loss_mask"][i * 2:(i + 1) * 2].sum()) for i in range(2)]
    weighted = sum(c * float(h["loss"]) for c, h in zip(counts, halves)) / sum(counts)
    assert counts[0] != counts[1] and float(mg["loss"]) == pytest.approx(weighted, rel=1e-5)


def test_non_finite_gradient_skips_and_counts(setup):
    base, method, adapters = setup
    lc = LossConfig()
    batch = _with_logps(_batch(), base, adapters, lc)
    batch["advantages"] = batch["advantages"].copy()
    batch["advantages"][0] = np.nan
    state, m, _ = _run(setup, lc, 2, batch)
    assert int(state.skipped) == 1 and int(state.step) == 0 and float(m["skipped"]) == 1.0
    for x, y in zip(jax.tree.leaves(state.params), jax.tree.leaves(adapters)):
        np.testing.assert_array_equal(np.asarray(x), np.asarray(y))
    assert int(state.opt_state[1].count) == 0  # Adam's step count did not move


def test_strict_isolation_step_runs_and_differs_from_forward(setup):
    base, _, adapters = setup
    lc = LossConfig()
    s_f, _, batch = _run(setup, lc, 2)
    strict = (base, MethodSpec(variant="dart", rank=4, alpha=8.0, isolation="strict"), adapters)
    s_s, _, _ = _run(strict, lc, 2, batch)
    diff = max(float(jnp.max(jnp.abs(a - b))) for a, b in zip(jax.tree.leaves(s_f.params), jax.tree.leaves(s_s.params)))
    assert diff > 0


def test_schedule_constant_with_warmup_starts_at_zero():
    sched = learning_rate(OptimConfig(lr=1e-5, warmup_steps=4))
    np.testing.assert_allclose([float(sched(k)) for k in range(6)], [0, 2.5e-6, 5e-6, 7.5e-6, 1e-5, 1e-5], rtol=1e-6)
    cos = learning_rate(OptimConfig(lr=1e-5, warmup_steps=2, total_steps=10, schedule="cosine", min_lr_ratio=0.1))
    assert float(cos(0)) == 0.0 and float(cos(2)) == pytest.approx(1e-5)
    assert float(cos(10)) == pytest.approx(1e-6, rel=1e-4)


def _torch_adamw(p0, cfg, lam):
    tp = torch.nn.Parameter(torch.tensor(p0))
    topt = torch.optim.AdamW([tp], lr=cfg.lr, betas=(cfg.b1, cfg.b2), eps=cfg.eps, weight_decay=cfg.weight_decay)
    return tp, topt, torch.optim.lr_scheduler.LambdaLR(topt, lam)


@pytest.mark.parametrize("clock", ["rl_step", "update"])
def test_adamw_with_clipping_matches_torch_on_both_clocks(clock):
    """Three RL steps × two mini-batch updates of our AdamW (clip 1.0, wd 0.01, warmup 2) vs
    torch.optim.AdamW + clip_grad_norm_ + LambdaLR. rl_step: LambdaLR stepped once per RL step,
    after both updates (verl's actor); update: stepped after every update. Tolerance 1e-6."""
    rng = np.random.default_rng(0)
    p0 = rng.normal(size=(5, 3)).astype(np.float32)
    grads = [rng.normal(scale=s, size=(5, 3)).astype(np.float32) for s in (3.0, 0.1, 2.0, 0.5, 1.5, 0.2)]
    cfg = OptimConfig(lr=1e-2, warmup_steps=2, weight_decay=0.01, clip_norm=1.0, schedule_clock=clock)
    opt, sched_fn = make_optimizer(cfg), learning_rate(cfg)
    params = {"w": jnp.asarray(p0)}
    st = opt.init(params)
    tp, topt, sched = _torch_adamw(p0, cfg, lambda k: k / 2 if k < 2 else 1.0)
    lrs = []
    for rl_step in range(3):
        for j in range(2):
            g = grads[2 * rl_step + j]
            d, st = opt.update({"w": jnp.asarray(g)}, st, params)
            lr = sched_fn(int(clock_of(cfg, rl_step, 2 * rl_step + j)))
            params = apply_update(params, d, lr)
            tp.grad = torch.tensor(g)
            torch.nn.utils.clip_grad_norm_([tp], 1.0)
            lrs.append(sched.get_last_lr()[0])
            topt.step()
            if clock == "update":
                sched.step()
            np.testing.assert_allclose(float(lr), lrs[-1], rtol=1e-6)
            np.testing.assert_allclose(np.asarray(params["w"]), tp.detach().numpy(), atol=1e-6)
        if clock == "rl_step":
            sched.step()
    # verl: a 2-step warmup spans two RL steps (four updates); per update it would end after one RL step
    expect = [0, 0, 5e-3, 5e-3, 1e-2, 1e-2] if clock == "rl_step" else [0, 5e-3, 1e-2, 1e-2, 1e-2, 1e-2]
    np.testing.assert_allclose(lrs, expect, rtol=1e-6)


def test_train_step_lr_follows_the_rl_step(setup):
    """The jitted step reads the schedule at the RL step it is given (default clock), not at its
    update count: two updates in RL step 0 of a warmup run both have lr 0 and move nothing."""
    base, method, adapters = setup
    lc = LossConfig()
    batch = _split(_with_logps(_batch(), base, adapters, lc), 2)
    oc = OptimConfig(lr=1e-3, warmup_steps=4)
    opt = make_optimizer(oc)
    step = jax.jit(make_train_step(CFG, method, lc, oc))
    state = init_state(adapters, opt)
    start = jax.device_get(state.params)
    for _ in range(2):
        state, m = step(state, base, batch, jax.random.PRNGKey(0), 0)
        assert float(m["lr"]) == 0.0
    assert int(state.step) == 2
    for x, y in zip(jax.tree.leaves(state.params), jax.tree.leaves(start)):
        np.testing.assert_array_equal(np.asarray(x), np.asarray(y))
    state, m = step(state, base, batch, jax.random.PRNGKey(0), 3)
    assert float(m["lr"]) == pytest.approx(7.5e-4)
    per_update = jax.jit(make_train_step(CFG, method, lc,
                                         OptimConfig(lr=1e-3, warmup_steps=4, schedule_clock="update")))
    _, m = per_update(state, base, batch, jax.random.PRNGKey(0), 0)
    assert float(m["lr"]) == pytest.approx(7.5e-4)  # three updates applied so far


def test_micro_scales_rejects_unknown_mode():
    with pytest.raises(ValueError, match="micro-batch mode"):
        losses.micro_scales(jnp.ones(2), "per_token")


def test_non_finite_values_outside_the_mask_change_nothing(setup):
    """NaN / ±inf old and reference log-probs where the loss mask is 0 (prompt, padding, an
    observation block) and a NaN advantage on a row with no loss token (a dropped prompt): the loss,
    every metric and the update equal those of the same batch with finite values there (verl zeroes
    values outside the mask first); before, 0·NaN made the loss NaN and the update was skipped."""
    base, method, adapters = setup
    lc = LossConfig(kl_coef=0.05, entropy_coef=0.01)
    clean = _with_logps(_batch(), base, adapters, lc)
    clean["loss_mask"] = clean["loss_mask"].copy()
    clean["loss_mask"][3] = 0.0
    dirty = {k: v.copy() for k, v in clean.items()}
    off = dirty["loss_mask"] == 0
    rng = np.random.default_rng(7)
    for k in ("old_logp", "ref_logp"):
        dirty[k][off] = rng.choice([np.nan, np.inf, -np.inf], size=int(off.sum()))
    dirty["advantages"][3] = np.nan
    s_clean, m_clean, _ = _run(setup, lc, 2, clean)
    s_dirty, m_dirty, _ = _run(setup, lc, 2, dirty)
    assert float(m_dirty["skipped"]) == 0.0 and np.isfinite(float(m_dirty["loss"]))
    for k in ("loss", "pg_loss", "kl", "entropy", "grad_norm", "pg_clipfrac", "ppo_kl"):
        assert float(m_dirty[k]) == float(m_clean[k]), k
    for x, y in zip(jax.tree.leaves(s_dirty.params), jax.tree.leaves(s_clean.params)):
        np.testing.assert_array_equal(np.asarray(x), np.asarray(y))
    # the aggregate of REFERENCE §5 the cross-checks use, likewise
    v = np.asarray([[1.0, np.nan, 2.0], [np.inf, 3.0, 0.0]])
    m = np.asarray([[1.0, 0.0, 1.0], [0.0, 1.0, 0.0]])
    assert float(losses.aggregate(jnp.asarray(v), jnp.asarray(m))) == pytest.approx(2.0)
