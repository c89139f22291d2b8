"""`train.micro_batch_padding = "own"`: each micro-batch padded to its own longest row and run as its own
call, against the default scan over micro-batches all padded to the mini-batch's longest — through the
update stage (rl/stages.Updater) on a tiny random model, fp32, with and without shared prompts, two
PPO epochs of two mini-batches (so the second update starts from the first's AdamW state).

Tolerances: the same sums in the same order, only reductions over the padded width may round
differently: the accumulated gradient within 2e-5 of its largest entry, each update's loss, gradient
norm and metrics to 1e-5 relative; the parameters after four AdamW updates within 1e-3 of the largest
change (AdamW divides each gradient entry by its own running scale, so a tiny entry's rounding
difference reaches its parameter at the scale of the learning rate: one entry of 384 moved 2.7e-4 of
the largest change here)."""

import jax
import numpy as np
import pytest

from dart_jax.adapters.method import MethodSpec, init_adapters
from dart_jax.models.transformer import init_params
from dart_jax.rl import stages
from dart_jax.rl.batch import micro_batches_apart, minibatches, split_shared_prefix
from dart_jax.rl.optim import make_optimizer
from dart_jax.rl.placement import place_state
from dart_jax.rl.step import BATCH_KEYS, init_state, make_accumulate, make_micro_step
from dart_jax.run.spec import LossConfig, OptimConfig, UpdatePlan
from rl.test_masters import CFG32
from rl.test_shared_prefix import GROUP, _groups


def _batch():
    b = _groups(prompt_lens=(5, 9, 5, 12), t=64, seed=4)
    # the first two groups' rows end early: their micro-batches need far fewer columns than the last
    for r in range(2 * GROUP):
        end = int((b["positions"][r] >= 0).sum())
        cut = min(end, 16)
        b["positions"][r, cut:] = -1
        b["tokens"][r, cut:] = 0
        b["route_ids"][r, cut:] = -1
        b["loss_roles"][r, cut:] = -1
        b["loss_mask"][r, cut:] = 0.0
    return b


def test_micro_batches_apart_are_cut_to_their_own_rows():
    b = _batch()
    mb = next(minibatches(b, np.arange(4 * GROUP), 4 * GROUP, GROUP, tuple(b)))
    parts = micro_batches_apart(mb, pad_multiple=8, share_prefix=False)
    assert [p["tokens"].shape for p in parts] == [(1, GROUP, 16), (1, GROUP, 16), (1, GROUP, 24), (1, GROUP, 32)]
    for i, p in enumerate(parts):
        w = p["tokens"].shape[2]
        assert not np.any(mb["positions"][i, :, w:] >= 0)  # nothing real was cut
        for k in ("tokens", "positions", "loss_mask"):
            np.testing.assert_array_equal(p[k][0], mb[k][i, :, :w])
        np.testing.assert_array_equal(p["advantages"][0], mb["advantages"][i])
    shared = micro_batches_apart(mb, pad_multiple=8, share_prefix=True)
    whole = split_shared_prefix(mb, pad_multiple=8)
    # a group splits only where its prompt + continuations are fewer tokens than its own cut rows:
    # group 0 (prompt 5, rows ≤ 16) 8 + 4 × 16 ≥ 4 × 16 stays whole; group 1 (prompt 9) 8 + 4 × 8 < 64
    # splits; group 2 8 + 4 × 24 ≥ 4 × 24 stays; group 3 (prompt 12) 16 + 4 × 24 < 4 × 32 splits
    assert ["prefix_tokens" in p for p in shared] == [False, True, False, True]
    for i, p in enumerate(shared):
        if "prefix_tokens" not in p:
            assert all(np.array_equal(p[k], parts[i][k]) for k in p)
            continue
        n = p["tokens"].shape[2]
        assert p["prefix_tokens"].shape[2] + GROUP * n < GROUP * parts[i]["tokens"].shape[2]
        np.testing.assert_array_equal(p["tokens"][0], whole["tokens"][i, :, :n])
        assert not np.any(whole["positions"][i, :, n:] >= 0)


def _mesh(data: int):
    return jax.make_mesh((data, 1, 1), ("data", "fsdp", "tensor"), devices=jax.devices()[:data],
                         axis_types=(jax.sharding.AxisType.Auto,) * 3)


def _updated(padding: str, share: bool, b: dict, mesh, lc: LossConfig):
    """(params before, params after, per-update metrics, final state) of two PPO epochs of two
    mini-batches of two groups on `b`."""
    base0 = init_params(CFG32, jax.random.PRNGKey(0))
    method = MethodSpec("dart", rank=4, alpha=8.0)
    ads = jax.tree.map(lambda x: x + 0.05, init_adapters(method, CFG32, jax.random.PRNGKey(1)))
    oc = OptimConfig(lr=1e-2, warmup_steps=0)
    plan = UpdatePlan(mini_batch=2 * GROUP, micro_batch=GROUP, ppo_epochs=2, seed=3, share_prefix=share,
                      pad_multiple=8, micro_batch_padding=padding)
    state, base = place_state(method, CFG32, base0, ads, make_optimizer(oc), mesh)
    up = stages.Updater(CFG32, method, lc, oc, plan, mesh)
    start = jax.device_get(state.params)
    state, upd = up(state, base, {k: v.copy() for k, v in b.items()}, 0, jax.random.PRNGKey(5))
    return start, jax.device_get(state.params), upd, state


def _with_logps(b: dict) -> dict:
    rng = np.random.default_rng(0)
    b["old_logp"] = rng.normal(-2.0, 0.3, b["tokens"].shape).astype(np.float32)
    b["ref_logp"] = rng.normal(-2.0, 0.3, b["tokens"].shape).astype(np.float32)
    return b


# shared prompts, verl's per-micro-batch mean (each micro-batch its own scale c_m: the rows cut at 16
# tokens carry fewer loss tokens) on two of the forced host devices (rows sharded over the data axis);
# rows without a shared prompt: the gradient test below
@pytest.mark.parametrize("share,micro_mode,devices", [(True, "verl_microbatch_mean", 2)])
def test_own_padding_updates_as_the_scan_does(share, micro_mode, devices):
    if len(jax.devices()) < devices:
        pytest.skip(f"needs {devices} devices")
    lc = LossConfig(kl_coef=0.01, entropy_coef=0.01, micro_mode=micro_mode)
    b = _with_logps(_batch())
    out = {padding: _updated(padding, share, b, _mesh(devices), lc) for padding in ("mini_batch", "own")}
    start, p0, u0, _ = out["mini_batch"]
    _, p1, u1, _ = out["own"]
    assert len(u0) == len(u1) == 4
    moved = max(float(np.abs(np.asarray(a) - np.asarray(s)).max())
                for a, s in zip(jax.tree.leaves(p0), jax.tree.leaves(start)))
    assert moved > 1e-3
    for x, y in zip(jax.tree.leaves(p0), jax.tree.leaves(p1)):
        np.testing.assert_allclose(np.asarray(y), np.asarray(x), rtol=0, atol=1e-3 * moved)
    for a, c in zip(u0, u1):
        for k in ("loss", "pg_loss", "kl", "entropy", "grad_norm", "loss_tokens", "lr", "row_tokens"):
            np.testing.assert_allclose(float(c[k]), float(a[k]), rtol=1e-5, atol=1e-7, err_msg=k)
        # the same real tokens, fewer padded ones; with shared prompts a group splits or not by its own
        # width, so the real tokens forwarded (a prompt once or per row) may differ
        if not share:
            assert c["forward_tokens"] == a["forward_tokens"]


def test_a_non_finite_gradient_skips_the_update_on_its_own_calls_too():
    b = _with_logps(_batch())
    b["advantages"][GROUP] = np.inf  # a row with loss tokens: its mini-batch's gradient is not finite
    start, after, upd, state = _updated("own", False, b, _mesh(1), LossConfig())
    skipped = [float(u["skipped"]) for u in upd]
    assert sum(skipped[:2]) == sum(skipped[2:]) == 1.0  # in each epoch, the mini-batch holding that row
    assert int(state.skipped) == 2 and int(state.step) == 2


def test_lora_dropout_is_refused():
    from configs import quickstart
    from dart_jax.rl.trainer import Trainer
    c = quickstart.get_config()
    c.train.share_prefix = False
    c.method.dropout = 0.1
    with pytest.raises(ValueError, match=r"set --config\.train\.micro_batch_padding=mini_batch$"):
        Trainer(c)


@pytest.mark.parametrize("share,micro_mode", [(False, "verl_microbatch_mean"), (True, "global")])
def test_own_padding_accumulates_the_scans_gradient(share, micro_mode):
    base = init_params(CFG32, jax.random.PRNGKey(0))
    method = MethodSpec("dart", rank=4, alpha=8.0)
    ads = jax.tree.map(lambda x: x + 0.05, init_adapters(method, CFG32, jax.random.PRNGKey(1)))
    lc = LossConfig(kl_coef=0.01, entropy_coef=0.01, micro_mode=micro_mode)
    b = _with_logps(_batch())
    mb = next(minibatches(b, np.arange(4 * GROUP), 4 * GROUP, GROUP, BATCH_KEYS))
    key = jax.random.PRNGKey(7)
    g0, m0 = jax.jit(make_accumulate(CFG32, method, lc))(ads, base, split_shared_prefix(mb, 8) if share else mb, key)
    start, add, _ = make_micro_step(CFG32, method, lc, OptimConfig())
    state = init_state(ads, make_optimizer(OptimConfig()))
    sc, carry = jax.jit(start)(state, mb["loss_mask"])
    sc = np.asarray(sc)
    add = jax.jit(add)
    if micro_mode != "global":  # each micro-batch its own scale: an index mix-up would show
        assert len(set(sc.tolist())) > 1
    parts = micro_batches_apart(mb, 8, share)
    assert len({p["tokens"].shape for p in parts}) > 1  # micro-batches of different widths
    for i, one in enumerate(parts):
        carry = add(carry, state.compute_params(), base, one, sc[i], key, i)
    g1, m1 = carry
    scale = max(float(np.abs(np.asarray(x)).max()) for x in jax.tree.leaves(g0))
    assert scale > 1e-4
    for x, y in zip(jax.tree.leaves(g0), jax.tree.leaves(g1)):
        np.testing.assert_allclose(np.asarray(y), np.asarray(x), rtol=0, atol=2e-5 * scale)
    for k in m0:
        np.testing.assert_allclose(float(m1[k]), float(m0[k]), rtol=1e-5, atol=1e-7, err_msg=k)
