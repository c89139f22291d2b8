"""MixLoRA (models.mixlora) against a hand-written PyTorch module of the same semantics
(parity/torch_mixlora.py: token dispatch by index, as MoE-PEFT) on a tiny random Llama from
transformers: logits, the load-balancing loss and the gradients of every trainable leaf (attention
LoRAs, experts, routers), fp32, tolerance 1e-5 (logits, aux) and 1e-5 relative to the largest
gradient. Router top-k renormalisation and masking on hand-made logits."""

import copy

import jax
import jax.numpy as jnp
import numpy as np
import pytest
import torch

from dart_jax.checkpoints.registry import load_model
from dart_jax.models import mixlora
from dart_jax.models.lora import init_lora
from dart_jax.models.transformer import forward, hidden_states_and_ffn_stats
from dart_jax.parity import torch_lora, torch_mixlora

TOL = 1e-5


def test_routing_renormalises_the_top_k_and_zeroes_the_rest():
    logits = np.log(np.asarray([[0.5, 0.3, 0.15, 0.05], [0.1, 0.2, 0.3, 0.4]], np.float32))
    router = np.eye(4, dtype=np.float32)
    probs, selected, weights = mixlora.gating(jnp.asarray(logits), jnp.asarray(router), 2)
    np.testing.assert_allclose(np.asarray(probs), np.exp(logits), rtol=1e-6)
    assert np.asarray(selected).tolist() == [[0, 1], [3, 2]]
    np.testing.assert_allclose(np.asarray(weights), [[0.5 / 0.8, 0.3 / 0.8, 0, 0], [0, 0, 0.3 / 0.7, 0.4 / 0.7]],
                               rtol=1e-6)
    _, _, w1 = mixlora.gating(jnp.asarray(logits), jnp.asarray(router), 1)
    assert np.asarray(w1).tolist() == [[1, 0, 0, 0], [0, 0, 0, 1]]  # top-1: the whole weight on one expert
    # the statistics count only real tokens: the masked row leaves no trace
    stats = mixlora.gate_stats(probs[None], selected[None], jnp.asarray([[True, False]]))
    assert float(stats["tokens"]) == 1.0
    np.testing.assert_allclose(np.asarray(stats["prob"]), np.exp(logits[0]), rtol=1e-6)
    assert np.asarray(stats["choice"]).tolist() == [[1, 0, 0, 0], [0, 1, 0, 0]]
    # hand-worked Mixtral loss for that one token: E · Σ_{k,e} f[k,e] P[e] = 4 · (0.5 + 0.3)
    layered = jax.tree.map(lambda a: a[None], stats)
    assert float(mixlora.load_balancing_loss(layered, 0.01)) == pytest.approx(0.01 * 4 * 0.8, rel=1e-6)
    with pytest.raises(ValueError, match="top_k"):
        mixlora.init_experts(None, jax.random.PRNGKey(0), 2, 3, 4, 8.0)


def _random_b(tree, key):
    """B factors random (init makes them 0, which would hide the B-side of the parity)."""
    leaves, treedef = jax.tree_util.tree_flatten_with_path(tree)
    out = []
    for i, (path, leaf) in enumerate(leaves):
        if any(getattr(p, "key", None) == "b" for p in path):
            leaf = 0.05 * jax.random.normal(jax.random.fold_in(key, i), leaf.shape, leaf.dtype)
        out.append(leaf)
    return jax.tree_util.tree_unflatten(treedef, out)


@pytest.mark.parametrize("experts,top_k", [(2, 2), (4, 2), (3, 1)])
def test_mixlora_matches_the_pytorch_reference(tiny_dirs, experts, top_k):
    path, model = tiny_dirs["llama"]
    cfg, base = load_model(path)
    key = jax.random.PRNGKey(experts * 10 + top_k)
    attn = init_lora(cfg, key, 4, 8.0, ("q", "k", "v", "o"))
    attn = attn.replace(params=_random_b(attn.params, jax.random.fold_in(key, 1)))
    ex = mixlora.init_experts(cfg, jax.random.fold_in(key, 2), experts, top_k, 4, 8.0)
    ex = ex.replace(params=_random_b(ex.params, jax.random.fold_in(key, 3)))
    ex = ex.replace(params=dict(ex.params, router=ex.params["router"] * 25.0))  # decisive, varied routing
    adapters = {"shared": attn, "experts": ex}
    rng = np.random.default_rng(0)
    tokens = rng.integers(3, 120, (2, 11))
    positions = np.tile(np.arange(11), (2, 1))
    routes = np.zeros((2, 11), np.int32)
    routes[1, :3] = -1  # not counted by the load-balancing loss (and no attention LoRA there)
    coef = 0.5

    def loss_fn(ads):
        h, _, stats = hidden_states_and_ffn_stats(base, ads, jnp.asarray(tokens), jnp.asarray(positions),
                                               jnp.asarray(routes), None, cfg=cfg)
        logits = jnp.einsum("btd,dv->btv", h, base["embed"].T if cfg.tie_word_embeddings else base["lm_head"])
        lp = jax.nn.log_softmax(logits[:, :-1].astype(jnp.float32))
        nll = -jnp.mean(jnp.take_along_axis(lp, jnp.asarray(tokens)[:, 1:, None], -1))
        aux = mixlora.load_balancing_loss(stats, coef)
        return nll + aux, (logits, aux)

    (_, (ours, aux)), grads = jax.value_and_grad(loss_fn, has_aux=True)(adapters)
    logits_plain, _ = forward(base, adapters, jnp.asarray(tokens), jnp.asarray(positions), jnp.asarray(routes),
                              None, cfg=cfg)
    np.testing.assert_allclose(np.asarray(logits_plain), np.asarray(ours, np.float32), atol=TOL, rtol=0)

    ref = copy.deepcopy(model).float()
    attn_f = torch_lora.torch_factors(attn)
    handles = torch_lora.install(ref, [attn_f], [attn.scale], routes)
    modules, routers, factors = torch_mixlora.install(ref, ex, ex.scale, top_k)
    out = ref(input_ids=torch.tensor(tokens), position_ids=torch.tensor(positions)).logits
    lp = torch.log_softmax(out[:, :-1], -1)
    nll = -lp.gather(-1, torch.tensor(tokens[:, 1:])[..., None]).mean()
    gate_logits = torch.cat([m.logits[0] for m in modules], dim=0)
    aux_ref = coef * torch_mixlora.load_balancing_loss(gate_logits, experts, top_k, torch.tensor(routes >= 0))
    (nll + aux_ref).backward()
    for h in handles:
        h.remove()

    np.testing.assert_allclose(np.asarray(ours), out.detach().numpy(), atol=TOL, rtol=0)
    assert float(aux) == pytest.approx(aux_ref.item(), abs=TOL)
    # every expert was chosen somewhere, so each one's gradient is compared for real
    chosen = torch.topk(torch.softmax(gate_logits, -1), top_k, -1).indices.unique().numel()
    assert chosen == experts

    pairs = []
    for layer in range(cfg.num_layers):
        pairs.append((grads["experts"].params["router"][layer], routers[layer].grad))
        for t in ("gate", "up", "down"):
            a, b = factors[layer][t]
            pairs.append((np.asarray(grads["experts"].params[t]["a"][layer]).transpose(0, 2, 1), a.grad))
            pairs.append((np.asarray(grads["experts"].params[t]["b"][layer]).transpose(0, 2, 1), b.grad))
    r = attn.rank
    for (layer, target), (A, B) in attn_f.items():
        pairs.append((np.asarray(grads["shared"].params[target]["a"][layer]).reshape(-1, r).T, A.grad))
        pairs.append((np.asarray(grads["shared"].params[target]["b"][layer]).reshape(r, -1).T, B.grad))
    gmax = max(float(t.abs().max()) for _, t in pairs)
    assert gmax > 1e-3
    for ours_g, ref_g in pairs:
        np.testing.assert_allclose(np.asarray(ours_g), ref_g.numpy(), atol=TOL * gmax, rtol=0)
    # the router's gradient has both parts: through the expert weights and through the aux loss
    assert all(float(np.abs(np.asarray(grads["experts"].params["router"][i])).max()) > 0
               for i in range(cfg.num_layers))
