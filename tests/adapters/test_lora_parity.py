"""LoRA numerics vs PEFT and vs a hand-written two-adapter PyTorch reference (fp32, tol 1e-5)."""

import jax
import jax.numpy as jnp
import numpy as np
import peft
import pytest
import torch
import transformers

import tiny_models
from dart_jax.checkpoints.hf_export import save_hf
from dart_jax.checkpoints.peft_io import HF_MODULES, export_peft, import_peft, merge_adapter
from dart_jax.checkpoints.registry import load_model
from dart_jax.models.lora import LoraAdapter, init_lora
from dart_jax.models.transformer import forward
from dart_jax.parity import torch_lora
from dart_jax.roles.router import RouterSpec, route_roles

TOL = 3e-5  # absolute, plus RTOL: logits reach |z|≈6 (weights std 0.2); two fp32 implementations differ by
# ~1 ulp·depth there: measured up to 1.5e-5 (2.5e-6 of max |z|) on an AVX-512 host, 1e-5 elsewhere
RTOL = 1e-5
OPEN, CLOSE = 100, 101
TARGET_MODULES = ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"]


def batch(seed=0, b=2, t=14):
    rng = np.random.default_rng(seed)
    tokens = rng.integers(3, 90, (b, t)).astype(np.int32)
    tokens[0, 3], tokens[0, 8] = OPEN, CLOSE
    tokens[1, 5] = OPEN  # unterminated span in row 1
    targets = rng.integers(0, 128, (b, t))
    return tokens, np.broadcast_to(np.arange(t, dtype=np.int32), (b, t)).copy(), targets


def nonzero(adapter: LoraAdapter, key) -> LoraAdapter:
    """B = 0 at init hides bugs; give every factor random values."""
    leaves, tree = jax.tree_util.tree_flatten(adapter.params)
    keys = jax.random.split(key, len(leaves))
    return adapter.replace(params=jax.tree_util.tree_unflatten(
        tree, [0.1 * jax.random.normal(k, x.shape) for k, x in zip(keys, leaves)]))


def jax_loss(base, adapters, tokens, positions, routes, targets, cfg):
    logits, _ = forward(base, adapters, jnp.asarray(tokens), jnp.asarray(positions), routes, None, cfg=cfg)
    lp = jax.nn.log_softmax(logits)
    return -jnp.mean(jnp.take_along_axis(lp, jnp.asarray(targets)[..., None], -1)), logits


def torch_loss(logits, targets):
    lp = torch.log_softmax(logits, -1)
    return -lp.gather(-1, torch.tensor(targets)[..., None]).mean()


@pytest.fixture(scope="module")
def qwen2(tmp_path_factory):
    path = str(tmp_path_factory.mktemp("qwen2_lora"))
    model = tiny_models.build("qwen2", path)
    cfg, base = load_model(path)
    return path, model, cfg, base


def test_one_adapter_matches_peft_logits_and_grads(qwen2, tmp_path):
    path, _, cfg, base = qwen2
    torch.manual_seed(0)
    hf = transformers.AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32)
    pm = peft.get_peft_model(hf, peft.LoraConfig(r=4, lora_alpha=8, target_modules=TARGET_MODULES, lora_dropout=0.0))
    with torch.no_grad():
        for n, p in pm.named_parameters():
            if "lora_" in n:
                p.copy_(0.1 * torch.randn_like(p))
    pm.save_pretrained(tmp_path / "peft")
    adapter = import_peft(str(tmp_path / "peft"), cfg)
    assert adapter.scale == 2.0 and adapter.rank == 4
    tokens, positions, targets = batch()
    routes = jnp.zeros(tokens.shape, jnp.int32)

    (loss, logits), grads = jax.value_and_grad(
        lambda ad: jax_loss(base, {"shared": ad}, tokens, positions, routes, targets, cfg), has_aux=True)(adapter)
    pm.train()
    out = pm(input_ids=torch.tensor(tokens, dtype=torch.long)).logits
    tl = torch_loss(out, targets)
    tl.backward()
    np.testing.assert_allclose(np.asarray(logits), out.detach().numpy(), atol=TOL, rtol=RTOL)
    np.testing.assert_allclose(float(loss), float(tl), atol=TOL)
    named = dict(pm.named_parameters())
    r = adapter.rank
    for target, module in HF_MODULES.items():
        for layer in range(cfg.num_layers):
            prefix = f"base_model.model.model.layers.{layer}.{module}"
            ga = named[f"{prefix}.lora_A.default.weight"].grad.numpy()
            gb = named[f"{prefix}.lora_B.default.weight"].grad.numpy()
            ours_a = np.asarray(grads.params[target]["a"][layer]).reshape(-1, r).T
            ours_b = np.asarray(grads.params[target]["b"][layer]).reshape(r, -1).T
            assert np.abs(ga).max() > 1e-4
            np.testing.assert_allclose(ours_a, ga, atol=TOL, rtol=RTOL)
            np.testing.assert_allclose(ours_b, gb, atol=TOL, rtol=RTOL)


def test_two_routed_adapters_match_torch_reference(qwen2):
    path, _, cfg, base = qwen2
    ads = {"reasoning": nonzero(init_lora(cfg, jax.random.PRNGKey(1), 4, 8), jax.random.PRNGKey(2)),
           "tool": nonzero(init_lora(cfg, jax.random.PRNGKey(3), 2, 8, targets=("q", "v", "down")),
                           jax.random.PRNGKey(4))}
    tokens, positions, targets = batch(1)
    routes = route_roles(jnp.asarray(tokens), RouterSpec((OPEN,), (CLOSE,)))
    assert 0 < int(routes.sum()) < routes.size
    (loss, logits), grads = jax.value_and_grad(
        lambda a: jax_loss(base, a, tokens, positions, routes, targets, cfg), has_aux=True)(ads)

    hf = transformers.AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32).eval()
    factors = [torch_lora.torch_factors(ads["reasoning"]), torch_lora.torch_factors(ads["tool"])]
    torch_lora.install(hf, factors, [ads["reasoning"].scale, ads["tool"].scale], np.asarray(routes))
    out = hf(input_ids=torch.tensor(tokens, dtype=torch.long)).logits
    tl = torch_loss(out, targets)
    tl.backward()
    np.testing.assert_allclose(np.asarray(logits), out.detach().numpy(), atol=TOL, rtol=RTOL)
    for i, name in enumerate(("reasoning", "tool")):
        ad = ads[name]
        for (layer, target), (A, B) in factors[i].items():
            r = ad.rank
            np.testing.assert_allclose(np.asarray(grads[name].params[target]["a"][layer]).reshape(-1, r).T,
                                       A.grad.numpy(), atol=TOL, rtol=RTOL)
            np.testing.assert_allclose(np.asarray(grads[name].params[target]["b"][layer]).reshape(r, -1).T,
                                       B.grad.numpy(), atol=TOL, rtol=RTOL)


def test_adapters_off_equal_base_exactly(qwen2):
    _, _, cfg, base = qwen2
    ads = {"reasoning": nonzero(init_lora(cfg, jax.random.PRNGKey(5), 4, 8), jax.random.PRNGKey(6))}
    tokens, positions, _ = batch(2)
    plain, _ = forward(base, None, jnp.asarray(tokens), jnp.asarray(positions), None, None, cfg=cfg)
    off, _ = forward(base, ads, jnp.asarray(tokens), jnp.asarray(positions),
                     jnp.full(tokens.shape, -1, jnp.int32), None, cfg=cfg)
    fresh, _ = forward(base, {"reasoning": init_lora(cfg, jax.random.PRNGKey(5), 4, 8)}, jnp.asarray(tokens),
                       jnp.asarray(positions), jnp.zeros(tokens.shape, jnp.int32), None, cfg=cfg)
    np.testing.assert_array_equal(np.asarray(off), np.asarray(plain))
    np.testing.assert_array_equal(np.asarray(fresh), np.asarray(plain))  # B = 0 at init


def test_export_to_peft_loads_in_peft_and_merged_hf(qwen2, tmp_path):
    path, _, cfg, base = qwen2
    ad = nonzero(init_lora(cfg, jax.random.PRNGKey(7), 4, 16, rslora=True), jax.random.PRNGKey(8))
    tokens, positions, _ = batch(3)
    ours, _ = forward(base, {"tool": ad}, jnp.asarray(tokens), jnp.asarray(positions),
                      jnp.zeros(tokens.shape, jnp.int32), None, cfg=cfg)
    export_peft(ad, cfg, str(tmp_path / "tool"), rslora=True, base_model_name_or_path=path)
    hf = transformers.AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32)
    pm = peft.PeftModel.from_pretrained(hf, str(tmp_path / "tool")).eval()
    with torch.no_grad():
        theirs = pm(input_ids=torch.tensor(tokens, dtype=torch.long)).logits.numpy()
    np.testing.assert_allclose(np.asarray(ours), theirs, atol=TOL, rtol=RTOL)
    back = import_peft(str(tmp_path / "tool"), cfg)
    assert back.scale == pytest.approx(ad.scale)
    for t in ad.params:
        np.testing.assert_array_equal(np.asarray(back.params[t]["a"]), np.asarray(ad.params[t]["a"]))

    save_hf(merge_adapter(base, ad), cfg, str(tmp_path / "merged"))
    merged = transformers.AutoModelForCausalLM.from_pretrained(str(tmp_path / "merged"), dtype=torch.float32).eval()
    with torch.no_grad():
        m = merged(input_ids=torch.tensor(tokens, dtype=torch.long)).logits.numpy()
    np.testing.assert_allclose(m, np.asarray(ours), atol=1e-4, rtol=0)


def test_peft_import_errors_name_the_problem(qwen2, tmp_path):
    _, _, cfg, _ = qwen2
    with pytest.raises(FileNotFoundError, match="adapter_config.json"):
        import_peft(str(tmp_path), cfg)
