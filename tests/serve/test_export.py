"""launch.export on a tiny trained DART run: the PEFT pair loads with `peft` onto the exported base and
gives the JAX policy's logits for its role; each merged single-role model equals base + that PEFT
adapter; the DART directory serves as the run did; and the PyTorch routed reference
(dart_jax/parity/torch_routed.py) decodes, from base/ and the PEFT pair, the very tokens the engine
serves for a routed pair of clearly different adapters (greedy, the tool's observations taken from
the served trajectory). Tolerances: logits 2e-4
(fp32, two frameworks), tokens exact."""

import os

import numpy as np
import pytest
import torch
import transformers
from peft import PeftModel

from dart_jax.parity.torch_routed import peft_factors, routed_greedy


@pytest.fixture(scope="module")
def exported(trained, tmp_path_factory):
    from launch import export
    out = str(tmp_path_factory.mktemp("export") / "q")
    assert export.main([f"--checkpoint={trained[0]}", f"--out={out}"]) == 0
    return out


def test_export_layout_and_refusals(exported, trained, tmp_path):
    from launch import export
    for part in ("base", "peft/reasoning", "peft/tool", "merged-reasoning", "merged-tool", "dart", "README.md"):
        assert os.path.exists(os.path.join(exported, part)), part
    assert "launch.serve --checkpoint=dart" in open(os.path.join(exported, "README.md")).read()
    with pytest.raises(SystemExit, match="not empty"):
        export.main([f"--checkpoint={trained[0]}", f"--out={exported}"])
    with pytest.raises(SystemExit, match="unknown"):
        export.main([f"--checkpoint={trained[0]}", f"--out={tmp_path / 'x'}", "--parts=base,weights"])


def _logits(model, ids):
    with torch.no_grad():
        return model(torch.tensor([ids])).logits[0].float().numpy()


def test_peft_pair_and_merged_models_match(exported):
    tok = transformers.AutoTokenizer.from_pretrained(os.path.join(exported, "base"))
    ids = tok.encode("Where is Vellmoor Abbey? <search> France </search>", add_special_tokens=False)
    for role in ("reasoning", "tool"):
        base = transformers.AutoModelForCausalLM.from_pretrained(os.path.join(exported, "base"),
                                                                 torch_dtype=torch.float32)
        with_peft = _logits(PeftModel.from_pretrained(base, os.path.join(exported, "peft", role)), ids)
        merged = transformers.AutoModelForCausalLM.from_pretrained(os.path.join(exported, f"merged-{role}"),
                                                                   torch_dtype=torch.float32)
        np.testing.assert_allclose(_logits(merged, ids), with_peft, atol=2e-4)
        factors, scale = peft_factors(os.path.join(exported, "peft", role))
        assert factors and scale > 0


def test_the_routed_reference_reproduces_the_served_tokens(serve_setup, tmp_path):
    """The engine serves a policy with two clearly different adapters (random A and B) routed per
    token; the reference reads the exported base/ and PEFT pair. Greedy requests: the reference decodes
    the same tokens and log-probs. Sampled requests (T = 1, they call the tool): the reference scores
    the served responses teacher-forced to the engine's log-probs. With the pair swapped neither
    agrees: the check sees the routing."""
    import jax

    from dart_jax.adapters.method import MethodSpec, init_adapters
    from dart_jax.checkpoints.peft_io import export_peft
    from dart_jax.parity.torch_routed import routed_logprobs
    from dart_jax.serve.engine import Engine, Request
    from dart_jax.serve.export import save_model
    agent, base, prompts = serve_setup
    cfg, tok = agent.spec.model, agent.tok
    adapters = init_adapters(MethodSpec(variant="dart", rank=4, alpha=8.0), cfg, jax.random.PRNGKey(3))
    adapters = {name: ad.__class__(**{**ad.__dict__, "params": {
        t: {"a": ab["a"], "b": 0.05 * jax.random.normal(jax.random.PRNGKey(k + 10 * i), ab["b"].shape)}
        for k, (t, ab) in enumerate(ad.params.items())}}) for i, (name, ad) in enumerate(adapters.items())}
    engine = Engine(agent, base, adapters, slots=4)
    greedy = [engine.submit(Request(tuple(p), temperature=0.0)) for p in prompts[:2]]
    sampled = [engine.submit(Request(tuple(p), temperature=1.0, seed=k)) for k, p in enumerate(prompts[2:])]
    engine.run_until_idle(timeout=300)
    greedy, sampled = [g.result(timeout=1) for g in greedy], [g.result(timeout=1) for g in sampled]
    engine.close()
    assert sum(t["tool_calls"] for t in sampled) >= 2
    save_model(jax.device_get(base), cfg, str(tmp_path / "base"), tok)
    for name, ad in adapters.items():
        export_peft(ad, cfg, str(tmp_path / "peft" / name))
    model = transformers.AutoModelForCausalLM.from_pretrained(str(tmp_path / "base"), torch_dtype=torch.float32)
    pair = {r: peft_factors(str(tmp_path / "peft" / r)) for r in ("reasoning", "tool")}
    swapped = {"reasoning": pair["tool"], "tool": pair["reasoning"]}
    tags = [[tok.encode(t, add_special_tokens=False)[0]] for t in (agent.protocol.tool_open, agent.protocol.tool_close)]
    stops = [list(s) for s in agent.spec.stops if tags[1][0] not in s]

    def agrees(p, traj, which):
        gen = np.asarray(traj["mask"]) > 0
        obs = [traj["ids"][s:s + n] for s, n, _ in traj["spans"]]
        ids, lps = routed_greedy(model, p, which, *tags, stops, len(traj["ids"]), obs)
        return ids == traj["ids"] and np.allclose(np.asarray(lps)[gen], np.asarray(traj["logprobs"])[gen],
                                                   atol=2e-4)

    def scores(p, traj, which):
        gen = np.asarray(traj["mask"]) > 0
        lps = routed_logprobs(model, p, traj["ids"], which, *tags)
        return np.allclose(lps[gen], np.asarray(traj["logprobs"])[gen], atol=2e-4)

    for p, traj in zip(prompts, greedy):
        assert agrees(p, traj, pair)
    for p, traj in zip(prompts[2:], sampled):
        assert scores(p, traj, pair)
    assert not any(scores(p, traj, swapped) for p, traj in zip(prompts[2:], sampled) if traj["tool_calls"])
