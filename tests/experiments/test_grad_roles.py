"""Per-role gradients (dart_jax/experiments/grad_roles.py) on a tiny random Qwen2: each equals autodiff
of the hand-written masked loss (both weightings, both parameter sets), and the separate passes
give exactly the terms of `isolation="strict"`. Tolerances: rtol 1e-4 / atol 1e-5 against gradients
of magnitude ~0.05 (fp32; the trainer's chunked log-softmax vs a plain one, measured max difference
3e-6)."""

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import tiny_models
from dart_jax.adapters.isolation import isolated_loss
from dart_jax.adapters.method import MethodSpec, init_adapters
from dart_jax.checkpoints.registry import load_model
from dart_jax.experiments.grad_roles import RoleGradients
from dart_jax.models.transformer import forward
from dart_jax.roles.router import PAD_ROLE, REASONING, TOOL, RouterSpec, loss_roles, route_roles

OPEN, CLOSE = 100, 101
ROUTER = RouterSpec((OPEN,), (CLOSE,))


@pytest.fixture(scope="module")
def setup(tmp_path_factory):
    path = str(tmp_path_factory.mktemp("qwen2_roles"))
    tiny_models.build("qwen2", path)
    cfg, base = load_model(path)
    rng = np.random.default_rng(0)
    ids = rng.integers(3, 90, (2, 20)).astype(np.int32)
    ids[0, [4, 8, 12, 15]] = [OPEN, CLOSE, OPEN, CLOSE]
    ids[1, [6, 10]] = [OPEN, CLOSE]
    positions = np.broadcast_to(np.arange(20, dtype=np.int32), (2, 20)).copy()
    loss_mask = np.ones((2, 20), np.float32)
    loss_mask[:, :3] = 0  # the prompt
    loss_mask[0, 9:11] = 0  # an observation after the first call
    ads = init_adapters(MethodSpec("dart", rank=4), cfg, jax.random.PRNGKey(0))
    ads = {n: a.replace(params=jax.tree_util.tree_map(
        lambda x: x + 0.05 * jax.random.normal(jax.random.PRNGKey(10 + i), x.shape), a.params))
        for i, (n, a) in enumerate(sorted(ads.items()))}
    return cfg, base, ids, positions, loss_mask, ads


def _token_logp(cfg, base, adapters, ids, positions, routes):
    logits, _ = forward(base, adapters, jnp.asarray(ids), jnp.asarray(positions), routes, None, cfg=cfg)
    lp = jax.nn.log_softmax(logits[:, :-1].astype(jnp.float32))
    tok = jnp.take_along_axis(lp, jnp.asarray(ids)[:, 1:, None], -1)[..., 0]
    return jnp.pad(tok, ((0, 0), (1, 0)))


def _role_mask(ids, loss_mask, role):
    r = np.asarray(loss_roles(route_roles(jnp.asarray(ids), ROUTER)))
    return loss_mask * (r == role)


@pytest.mark.parametrize("weighting", ["advantage", pytest.param("loglik", marks=pytest.mark.slow)])
def test_full_parameter_role_gradient_is_autodiff_of_the_masked_loss(setup, weighting):
    cfg, base, ids, positions, loss_mask, _ = setup
    method = MethodSpec("full")
    rg = RoleGradients(cfg, method, ROUTER, weighting)
    adv = np.array([0.7, -1.3], np.float32)
    w = adv if weighting == "advantage" else np.ones(2, np.float32)
    routes = jnp.full(ids.shape, -1, jnp.int32)
    for role, name in ((REASONING, "reasoning"), (TOOL, "tool")):
        m = _role_mask(ids, loss_mask, role)
        assert m.sum() > 0
        want = jax.grad(lambda p: -jnp.sum(w[:, None] * m * _token_logp(cfg, p, None, ids, positions, routes))
                        / m.sum())(base)
        got, n = rg(base, base, ids, positions, loss_mask, adv, name)
        assert n == int(m.sum())
        for a, b in zip(jax.tree.leaves(got), jax.tree.leaves(want)):
            np.testing.assert_allclose(np.asarray(a), np.asarray(b), rtol=1e-4, atol=1e-5)


def test_backbone_gradient_under_fixed_adapters_is_autodiff_of_the_masked_loss(setup):
    """params=full on a trained DART policy: the role's gradient with respect to the backbone, through the
    routed forward with both adapters (B ≠ 0) held fixed. Tolerance as above (fp32)."""
    cfg, base, ids, positions, loss_mask, ads = setup
    rg = RoleGradients(cfg, MethodSpec("dart", rank=4), ROUTER, "advantage", wrt="base")
    adv = np.array([0.7, -1.3], np.float32)
    routes = route_roles(jnp.asarray(ids), ROUTER).astype(jnp.int32)
    plain = RoleGradients(cfg, MethodSpec("full"), ROUTER, "advantage")
    for role, name in ((REASONING, "reasoning"), (TOOL, "tool")):
        m = _role_mask(ids, loss_mask, role)
        want = jax.grad(lambda p: -jnp.sum(adv[:, None] * m * _token_logp(cfg, p, ads, ids, positions, routes))
                        / m.sum())(base)
        got, n = rg(ads, base, ids, positions, loss_mask, adv, name)
        assert n == int(m.sum())
        assert jax.tree.structure(got) == jax.tree.structure(base)
        for a, b in zip(jax.tree.leaves(got), jax.tree.leaves(want)):
            np.testing.assert_allclose(np.asarray(a), np.asarray(b), rtol=1e-4, atol=1e-5)
        # the adapters are in the forward: not the bare backbone's gradient
        bare, _ = plain(base, base, ids, positions, loss_mask, adv, name)
        assert max(float(jnp.abs(a - b).max()) for a, b in zip(jax.tree.leaves(got), jax.tree.leaves(bare))) > 1e-6
    with pytest.raises(ValueError, match="no adapters to hold fixed"):
        RoleGradients(cfg, MethodSpec("full"), ROUTER, wrt="base")
    with pytest.raises(ValueError, match="wrt"):
        RoleGradients(cfg, MethodSpec("dart", rank=4), ROUTER, wrt="adapters")


def test_separate_passes_are_the_strict_isolation_terms(setup):
    """The reasoning pass's gradient on the reasoning adapter (and the tool pass's on the tool adapter)
    is what `isolation="strict"` gives that adapter, up to the token-mean's denominator; the passes
    also reach the other adapter (through attention), which strict isolation cuts."""
    cfg, base, ids, positions, _, ads = setup
    loss_mask = np.ones(ids.shape, np.float32)
    method = MethodSpec("dart", rank=4)
    rg = RoleGradients(cfg, method, ROUTER, "loglik")
    roles = route_roles(jnp.asarray(ids), ROUTER)
    token_routes = loss_roles(roles)
    valid = (token_routes != PAD_ROLE).astype(jnp.float32)
    w = valid / valid.sum()

    def per_token(adapters):
        return -_token_logp(cfg, base, adapters, ids, positions, roles.astype(jnp.int32))

    strict = jax.grad(lambda a: isolated_loss(per_token, a, w, token_routes, "strict"))(ads)
    names = sorted(ads)  # reasoning = 0, tool = 1
    for role, name in ((REASONING, "reasoning"), (TOOL, "tool")):
        got, n = rg(ads, base, ids, positions, loss_mask, np.ones(2), name)
        share = n / float(valid.sum())
        own = names[role]
        for a, b in zip(jax.tree.leaves(got[own].params), jax.tree.leaves(strict[own].params)):
            np.testing.assert_allclose(share * np.asarray(a), np.asarray(b), rtol=1e-4, atol=1e-6)
        other = names[1 - role]
        assert max(float(jnp.abs(x).max()) for x in jax.tree.leaves(got[other].params)) > 0


def test_random_split_is_a_partition_of_the_roles_tokens_with_their_sizes(setup):
    """The role-agnostic control: two random token sets of one row with the reasoning and tool roles' sizes,
    disjoint, covering exactly the row's reasoning ∪ tool tokens; their token-mean gradients recombine into
    the roles' (|A|·g_A + |B|·g_B = |R|·g_R + |T|·g_T: the sum of every generated token's gradient), against
    autodiff of each set's masked loss; seeded. Tolerances as above (fp32)."""
    cfg, base, ids, positions, loss_mask, _ = setup
    rg = RoleGradients(cfg, MethodSpec("full"), ROUTER, "loglik")
    row = (ids[:1], positions[:1], loss_mask[:1], np.ones(1, np.float32))
    (g_r, n_r), (g_t, n_t) = (rg(base, base, *row, role) for role in ("reasoning", "tool"))
    seen = []
    orig = rg._masked

    def spy(params, b, arr, mask, adv):
        seen.append(np.asarray(mask).copy())
        return orig(params, b, arr, mask, adv)

    rg._masked = spy
    (g_a, n_a), (g_b, n_b) = rg.random_split(base, base, *row, np.random.default_rng(7))
    rg._masked = orig
    assert (n_a, n_b) == (n_r, n_t) and n_r > 0 and n_t > 0
    m_a, m_b = seen
    roles = _role_mask(ids[:1], loss_mask[:1], REASONING) + _role_mask(ids[:1], loss_mask[:1], TOOL)
    assert not (m_a * m_b).any() and np.array_equal(m_a[:, :20] + m_b[:, :20], roles)
    assert not np.array_equal(m_a[:, :20], _role_mask(ids[:1], loss_mask[:1], REASONING))  # not the roles again
    routes = jnp.full((1, 20), -1, jnp.int32)
    want_a = jax.grad(lambda p: -jnp.sum(m_a[:, :20] * _token_logp(cfg, p, None, ids[:1], positions[:1], routes))
                      / m_a.sum())(base)
    for x, y in zip(jax.tree.leaves(g_a), jax.tree.leaves(want_a)):
        np.testing.assert_allclose(np.asarray(x), np.asarray(y), rtol=1e-4, atol=1e-5)
    for a, b, r, t in zip(*(jax.tree.leaves(g) for g in (g_a, g_b, g_r, g_t))):
        np.testing.assert_allclose(n_a * np.asarray(a) + n_b * np.asarray(b), n_r * np.asarray(r) + n_t * np.asarray(t),
                                   rtol=1e-4, atol=1e-4)
    # seeded: the same generator state gives the same sets
    seen.clear()
    rg._masked = spy
    rg.random_split(base, base, *row, np.random.default_rng(7))
    rg._masked = orig
    assert np.array_equal(seen[0], m_a)
    # no tool tokens: no control either
    no_tool = ids[:1].copy()
    no_tool[np.isin(no_tool, [OPEN, CLOSE])] = 5
    assert rg.random_split(base, base, no_tool, *row[1:], np.random.default_rng(0)) == [(None, 0), (None, 0)]


def test_a_role_without_tokens_and_bad_options(setup):
    cfg, base, ids, positions, loss_mask, _ = setup
    rg = RoleGradients(cfg, MethodSpec("full"), ROUTER)
    no_tool = ids.copy()
    no_tool[no_tool == OPEN] = 5
    no_tool[no_tool == CLOSE] = 6
    assert rg(base, base, no_tool, positions, loss_mask, np.ones(2), "tool") == (None, 0)
    with pytest.raises(ValueError, match="weighting"):
        RoleGradients(cfg, MethodSpec("full"), ROUTER, "advantages")
    with pytest.raises(ValueError, match="role"):
        rg.arrays(ids, positions, loss_mask, "search")
    with pytest.raises(ValueError, match="separate passes"):
        RoleGradients(cfg, dataclasses.replace(MethodSpec("dart", rank=4), isolation="strict"), ROUTER)


def test_role_gradient_matches_pytorch(tiny_smollm_dir):
    """One case against PyTorch (parity/: transformers + the hook-based routed LoRA of torch_lora):
    the tool and the reasoning gradient of both DART adapters (B ≠ 0) on the crosscheck's QA
    trajectories, advantage-weighted. Tolerance: max |Δ| ≤ 1e-4 × max |g| + 1e-7 (fp32)."""
    import torch

    from dart_jax.parity import loss_check, torch_lora
    from dart_jax.tokenization.sentinels import router_for_tags
    setup = loss_check.prepare(tiny_smollm_dir)
    b, ads = setup.batch, setup.adapters
    router = router_for_tags(setup.tok, "<search>", "</search>")
    rg = RoleGradients(setup.cfg, setup.method, router, "advantage", pad_multiple=16)
    adv = np.array([1.0, -0.5, 0.8, -1.2], np.float32)[:len(b["tokens"])]
    names = sorted(ads)
    for role in ("reasoning", "tool"):
        arr = rg.arrays(b["tokens"], b["positions"], b["loss_mask"], role)
        ours, n = rg(ads, setup.base, b["tokens"], b["positions"], b["loss_mask"], adv, role)
        assert n > 0
        factors = [torch_lora.torch_factors(ads[k]) for k in names]
        fwd = loss_check._torch_forward(setup, factors, [ads[k].scale for k in names], 1.0)
        tb = {k: torch.tensor(arr[k]) for k in ("tokens", "positions", "route_ids")}
        logp, _ = fwd(tb)
        m = torch.tensor(arr["loss_mask"])
        loss = -(torch.tensor(adv)[:, None] * m * logp.float()).sum() / m.sum()
        loss.backward()
        for i, name in enumerate(names):
            for target in sorted(ads[name].params):
                for layer in range(setup.cfg.num_layers):
                    A, B = factors[i][(layer, target)]
                    ga_, gb_ = loss_check._our_grads_flat(ours, name, target, layer, ads[name].rank)
                    for want, got in ((A.grad.numpy(), ga_), (B.grad.numpy(), gb_)):
                        scale = float(np.abs(want).max())
                        assert float(np.abs(got - want).max()) <= 1e-4 * scale + 1e-7, (role, name, target, layer)
