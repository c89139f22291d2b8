"""Shared-prefix updates (train.share_prefix): a micro-batch's common prompt runs once. The split on
hand-made rows, and the gradient and metrics of a GRPO mini-batch with and without it on a tiny
random model (fp32; tolerance 2e-5 relative to the largest entry — the two programs sum the same
terms in a different order)."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from dart_jax.adapters.method import MethodSpec, init_adapters
from dart_jax.models.transformer import hidden_states, shared_prefix_hidden_states
from dart_jax.rl.batch import PREFIX_KEYS, group_order, minibatches, shared_prefix_length, split_shared_prefix
from dart_jax.rl.step import BATCH_KEYS, make_accumulate, make_scorer
from dart_jax.run.spec import LossConfig
from tiny_dart import CFG, dart_setup

GROUP = 4


def _groups(prompt_lens=(5, 9), t=24, seed=0):
    """GRPO-like rows, right-padded: per group a common prompt (no loss), then each row's own
    continuation of its own length, with an observation span (no loss) in one row, routes
    alternating between the two adapters."""
    rng = np.random.default_rng(seed)
    n = GROUP * len(prompt_lens)
    tokens = np.zeros((n, t), np.int32)
    positions = np.full((n, t), -1, np.int32)
    mask = np.zeros((n, t), np.float32)
    routes = np.full((n, t), -1, np.int32)
    group = np.repeat(np.arange(len(prompt_lens)), GROUP).astype(np.int32)
    for g, p in enumerate(prompt_lens):
        prompt = rng.integers(0, 64, p)
        prompt_routes = np.where(np.arange(p) % 3 == 0, 1, 0)
        for j in range(GROUP):
            r = g * GROUP + j
            length = p + 3 + (5 * j) % (t - p - 3)
            tokens[r, :p] = prompt
            tokens[r, p:length] = rng.integers(0, 64, length - p)
            positions[r, :length] = np.arange(length)
            routes[r, :p] = prompt_routes
            routes[r, p:length] = np.where(np.arange(p, length) % 5 < 2, 1, 0)
            mask[r, p:length] = 1.0
            if j == 1:
                mask[r, p + 2:p + 4] = 0.0  # an observation
    lroles = np.concatenate([np.full((n, 1), -1), routes[:, :-1]], 1).astype(np.int32)
    lroles[positions < 0] = -1
    return {"tokens": tokens, "positions": positions, "route_ids": routes, "loss_roles": lroles, "loss_mask": mask,
            "advantages": rng.normal(size=n).astype(np.float32), "group": group}


def test_shared_prefix_length_stops_before_the_first_difference_and_the_first_loss_token():
    b = _groups()
    rows = slice(0, GROUP)
    args = [b[k][rows] for k in ("tokens", "positions", "route_ids", "loss_mask")]
    assert shared_prefix_length(*args) == 4  # prompt of 5: token 4 stays in the continuation (token 5 has loss)
    args[3] = np.zeros_like(args[3])  # no loss anywhere: the common part ends where the rows first differ
    common = int(np.argmin(np.all(args[0] == args[0][:1], axis=0)))
    assert shared_prefix_length(*args) == common >= 5
    mixed = [np.concatenate([b[k][:2], b[k][GROUP:GROUP + 2]])
             for k in ("tokens", "positions", "route_ids", "loss_mask")]
    assert shared_prefix_length(*mixed) == 0  # two prompts: nothing in common at column 0


def test_split_keeps_every_token_once_and_pads_with_position_minus_one():
    b = _groups()
    mb = {k: v.reshape((2, GROUP) + v.shape[1:]) for k, v in b.items()}
    out = split_shared_prefix(mb, pad_multiple=4)
    assert out["prefix_tokens"].shape == (2, 1, 8)       # cuts 4 and 8 -> P 8 (multiple of 4)
    np.testing.assert_array_equal(out["prefix_positions"][0, 0], [0, 1, 2, 3, -1, -1, -1, -1])
    np.testing.assert_array_equal(out["prefix_positions"][1, 0], np.arange(8))
    s = out["tokens"].shape[2]
    assert s % 4 == 0 and out["tokens"].shape[:2] == (2, GROUP)
    for m, cut in enumerate((4, 8)):
        for j in range(GROUP):
            r = m * GROUP + j
            real = b["positions"][r] >= 0
            n_real = int(real.sum())
            np.testing.assert_array_equal(out["tokens"][m, j, :n_real - cut], b["tokens"][r, cut:n_real])
            np.testing.assert_array_equal(out["positions"][m, j, :n_real - cut], np.arange(cut, n_real))
            assert np.all(out["positions"][m, j, n_real - cut:] == -1)
            assert out["loss_mask"][m, j].sum() == b["loss_mask"][r].sum()
    np.testing.assert_array_equal(out["advantages"], mb["advantages"])
    # rows of two prompts in one micro-batch share nothing: the batch is returned as it is
    mixed = {k: np.concatenate([v[:2], v[GROUP:GROUP + 2]]).reshape((1, 4) + v.shape[1:]) for k, v in b.items()}
    assert split_shared_prefix(mixed, 8) is mixed
    # one micro-batch sharing a prompt beside one sharing nothing: the continuations would be as wide
    # as the rows, so splitting saves nothing and nothing is split
    both = {k: np.concatenate([v[:GROUP], mixed[k][0]]).reshape((2, GROUP) + v.shape[1:]) for k, v in b.items()}
    assert split_shared_prefix(both, 8) is both


def test_group_order_keeps_groups_whole():
    g = np.asarray([0, 0, 1, 1, 2, 2, 1])
    np.testing.assert_array_equal(group_order(g, None), [0, 1, 2, 3, 6, 4, 5])
    order = group_order(g, np.random.default_rng(0))
    assert sorted(order.tolist()) == list(range(7))
    runs = [g[i] for i in order]
    assert all(runs.index(x) + runs.count(x) - 1 == len(runs) - 1 - runs[::-1].index(x) for x in set(runs))


@pytest.fixture(scope="module")
def setup():
    return dart_setup()


def test_hidden_states_of_the_continuations_equal_the_full_rows(setup):
    base, method, adapters = setup
    from dart_jax.adapters.method import model_trees
    b_, ads = model_trees(method, adapters, base, None)
    b = _groups()
    rows = slice(0, GROUP)
    full, _ = hidden_states(b_, ads, jnp.asarray(b["tokens"][rows]), jnp.asarray(b["positions"][rows]),
                            jnp.asarray(b["route_ids"][rows]), None, cfg=CFG)
    mb = {k: v[rows][None] for k, v in b.items()}
    out = split_shared_prefix(mb, pad_multiple=4)
    h = shared_prefix_hidden_states(b_, ads, tuple(jnp.asarray(out[k][0, 0])[None] for k in PREFIX_KEYS),
                                    jnp.asarray(out["tokens"][0]), jnp.asarray(out["positions"][0]),
                                    jnp.asarray(out["route_ids"][0]), cfg=CFG)
    for j in range(GROUP):
        n_real = int((b["positions"][j] >= 0).sum())
        np.testing.assert_allclose(np.asarray(h[j, :n_real - 4]), np.asarray(full[j, 4:n_real]), rtol=0, atol=2e-5)


@pytest.mark.parametrize("remat,scan,isolation,agg,micro,drop", [
    ("none", True, "forward", "token-mean", "global", False),
    ("dots_no_batch", True, "forward", "token-mean", "global", False),
    ("full", False, "forward", "token-mean", "global", False),
    ("none", True, "strict", "token-mean", "global", False),
    ("none", True, "forward", "seq-mean-token-sum-norm", "verl_microbatch_mean", False),
    ("none", True, "forward", "seq-mean-token-mean", "global", True)])
def test_gradient_and_metrics_equal_the_unshared_update(setup, remat, scan, isolation, agg, micro, drop):
    import dataclasses
    base, method, adapters = setup
    method = dataclasses.replace(method, isolation=isolation)
    cfg = dataclasses.replace(CFG, remat_policy=remat, scan_layers=scan)
    lc = LossConfig(kl_coef=0.01, entropy_coef=0.01, agg_mode=agg, micro_mode=micro, norm_length=20)
    b = _groups()
    if drop:  # a dropped prompt (its reference failed): its group keeps its rows, with no loss
        b["loss_mask"][:GROUP] = 0.0
        b["advantages"][:GROUP] = 0.0
    score = jax.jit(make_scorer(cfg, lc.temperature, lc.logprob_chunk))
    from dart_jax.adapters.method import model_trees
    b_, ads = model_trees(method, adapters, base, None)
    args = [jnp.asarray(b[k]) for k in ("tokens", "positions", "route_ids")]
    old = (np.asarray(score(b_, ads, *args))
           + np.random.default_rng(1).normal(0, 0.3, b["tokens"].shape).astype(np.float32))
    b.update(old_logp=old.astype(np.float32), ref_logp=np.asarray(score(base, None, args[0], args[1], None)))
    order = group_order(b["group"], np.random.default_rng(3))
    plain = next(minibatches(b, order, 2 * GROUP, GROUP, BATCH_KEYS))
    shared = split_shared_prefix(plain, pad_multiple=4)
    assert set(PREFIX_KEYS) <= set(shared)
    acc = jax.jit(make_accumulate(cfg, method, lc))
    g0, m0 = acc(adapters, base, plain, jax.random.PRNGKey(0))
    g1, m1 = acc(adapters, base, shared, jax.random.PRNGKey(0))
    flat0, flat1 = jax.tree.leaves(g0), jax.tree.leaves(g1)
    scale = max(float(jnp.max(jnp.abs(x))) for x in flat0)
    assert scale > 1e-4
    for x, y in zip(flat0, flat1):
        np.testing.assert_allclose(np.asarray(y), np.asarray(x), rtol=0, atol=2e-5 * scale)
    for k in m0:
        np.testing.assert_allclose(float(m1[k]), float(m0[k]), rtol=1e-5, atol=1e-7, err_msg=k)


def test_mixlora_is_refused(setup):
    base, _, _ = setup
    method = MethodSpec(variant="mixlora", rank=4, alpha=8.0, experts=2, top_k=1)
    adapters = init_adapters(method, CFG, jax.random.PRNGKey(1))
    from dart_jax.adapters.method import model_trees
    b_, ads = model_trees(method, adapters, base, None)
    pre = tuple(jnp.zeros((1, 4), jnp.int32) for _ in PREFIX_KEYS)
    with pytest.raises(ValueError, match="MixLoRA"):
        shared_prefix_hidden_states(b_, ads, pre, jnp.zeros((2, 4), jnp.int32), jnp.zeros((2, 4), jnp.int32),
                                    jnp.zeros((2, 4), jnp.int32), cfg=CFG)


@pytest.mark.parametrize("change", [dict(variant="mixlora"), dict(variant="2agent"), dict(dropout=0.1),
                                    dict(micro_batch=16)])
def test_trainer_refuses_what_a_shared_prompt_would_change(change):
    from configs import quickstart_sql
    from dart_jax.rl.trainer import Trainer
    c = quickstart_sql.get_config()
    assert c.train.share_prefix and c.train.micro_batch == c.train.group_size
    if "micro_batch" in change:  # a micro-batch spanning two groups shares no prompt
        c.train.micro_batch = change.pop("micro_batch")
    c.method.update(change)
    if change.get("variant") == "2agent":
        c.router.convention = "dart_jax"
    with pytest.raises(ValueError, match="share_prefix"):
        Trainer(c)
