"""Rollouts on the mesh (issue 20): on 8 forced CPU devices, meshes (8,1,1), (2,1,4) and (1,1,8) give
the single-device rollout — the same ids, routes, masks, finish reasons and turns, and the same
sampler log-probs within 2e-5 (fp32; sharding a contraction over devices changes its summation
order: measured max |Δ| below 2e-6 here) — greedy and sampled, with SQL tool pauses (observations
appended into the sharded KV cache). The decode state is really sharded: the KV cache's batch over
(data, fsdp) and its KV heads over tensor where they divide, as are the per-layer weight copies.

A tiny random Qwen2 (tied embeddings: the decode head's [D, V] copy is sharded too; 8 heads, 4 KV
heads) with SmolLM2's tokenizer and routed DART adapters with non-zero B. The tool tags are frequent
tokens (" the" opens, "." closes) made likely by pointing their embedding rows along the prompt's
mean hidden state, as in test_compose."""

import dataclasses
import os

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import tiny_models
from dart_jax.adapters.method import MethodSpec, init_adapters
from dart_jax.checkpoints.registry import load_model
from dart_jax.models.sharding import adapter_shardings
from dart_jax.models.transformer import hidden_states, per_layer_params
from dart_jax.parallel.mesh import make_mesh
from dart_jax.rollout.agent import Agent, RolloutConfig, SinglePolicy, tool_for
from dart_jax.rollout.placement import RolloutMesh
from dart_jax.rollout.protocol import SQL
from dart_jax.rollout.sampling import SamplingConfig
from dart_jax.tokenization.tokenizer import encode_chat, load_tokenizer
from dart_jax.tools.sqlite_exec import SQLiteTool

DB = os.path.join(os.path.dirname(__file__), "..", "..", "data", "spider", "database", "concert_singer",
                  "concert_singer.sqlite")
FREQUENT = dataclasses.replace(SQL, tool_open=" the", tool_close=".")
QUESTIONS = ["How many singers are there?", "List the names of all stadiums.", "What is the oldest singer's age?",
             "Which concerts happened in 2014?"]
MESHES = [(8, 1, 1), (2, 1, 4), (1, 1, 8)]


@pytest.fixture(scope="module")
def setup(tmp_path_factory, smollm2):
    _, _, tok = smollm2
    path = str(tmp_path_factory.mktemp("tiny_qwen_8h"))
    tiny_models.build("qwen2", path, vocab_size=len(tok), hidden_size=64, intermediate_size=96,
                      num_attention_heads=8, num_key_value_heads=4, max_position_embeddings=2048,
                      bos_token_id=1, eos_token_id=2, pad_token_id=2)
    tok.save_pretrained(path)
    tok = load_tokenizer(path)
    cfg, base = load_model(path)
    prompts = [encode_chat(tok, [{"role": "user", "content": q}]) for q in QUESTIONS]
    the, dot = (tok.encode(t, add_special_tokens=False)[0] for t in (" the", "."))
    h, _ = hidden_states(base, None, jnp.asarray([prompts[0]]), jnp.arange(len(prompts[0]))[None], None, None, cfg=cfg)
    m = np.asarray(h[0].mean(0), np.float32)
    rng = np.random.default_rng(0)
    embed = np.array(base["embed"])
    embed[the] = 10.0 * m / (m @ m)
    embed[dot] = 9.5 * m / (m @ m) + 0.5 * rng.standard_normal(m.shape) / np.linalg.norm(m)
    embed = embed.astype(np.float32)
    ads = init_adapters(MethodSpec(variant="dart", rank=4, alpha=8.0), cfg, jax.random.PRNGKey(1))
    ads = jax.tree.map(lambda x: x + 0.05 * jax.random.normal(jax.random.PRNGKey(2), x.shape, x.dtype), ads)
    prompts = [p for p in prompts for _ in range(2)]  # groups of 2: the shared prefill's broadcast
    return cfg, path, embed, ads, tok, prompts


def spec(x) -> tuple:
    """x's PartitionSpec padded to its rank (jax drops trailing Nones)."""
    return tuple(x.sharding.spec) + (None,) * (x.ndim - len(x.sharding.spec))


def _policy(setup, mesh):
    cfg, path, embed, ads, _, _ = setup
    _, base = load_model(path, mesh=mesh)
    base = dict(base, embed=jax.device_put(jnp.asarray(embed), base["embed"].sharding))
    if mesh is not None:
        ads = jax.device_put(ads, adapter_shardings(ads, cfg, mesh))
    return base, ads


def _rollout(setup, mesh, temperature):
    cfg, _, _, _, tok, prompts = setup
    base, ads = _policy(setup, mesh)
    rc = RolloutConfig(max_turns=2, max_tokens_per_turn=32, max_response_tokens=200, max_obs_tokens=48,
                       invalid_action="none")
    agent = Agent(cfg, tok, FREQUENT, tool_for(SQL, SQLiteTool(timeout_s=5.0)),
                  SamplingConfig(temperature=temperature), rc, mesh=mesh)
    return agent.rollout(base, ads, prompts, list(range(len(prompts))), [{"db_path": DB}] * len(prompts), seed=5)


@pytest.fixture(scope="module")
def single(setup):
    return {t: _rollout(setup, None, t) for t in (0.0, 1.0)}


CASES = [(s, 0.0) for s in MESHES] + [((2, 1, 4), 1.0)] + [
    pytest.param(s, 1.0, marks=pytest.mark.slow) for s in MESHES if s != (2, 1, 4)]  # CI budget


@pytest.mark.parametrize("shape,temperature", CASES)
def test_mesh_rollout_equals_single_device(setup, single, shape, temperature):
    ref = single[temperature]
    assert ref.tool_calls().sum() >= 2, ref.turns  # tool pauses happen: appends into the sharded cache
    tb = _rollout(setup, make_mesh(shape), temperature)
    np.testing.assert_array_equal(tb.ids, ref.ids)
    np.testing.assert_array_equal(tb.route_ids, ref.route_ids)
    np.testing.assert_array_equal(tb.loss_mask, ref.loss_mask)
    np.testing.assert_allclose(tb.sampler_logprobs, ref.sampler_logprobs, atol=2e-5, rtol=0)
    assert tb.finish_reason == ref.finish_reason and tb.turns == ref.turns


def test_greedy_rollout_without_tool_pauses(setup):
    """Decoding without tool pauses: the tool tags are ordinary rare words (" zebra", " giraffe")
    the tiny model never writes, so every row decodes its turn in one segment."""
    cfg, _, _, _, tok, prompts = setup
    rc = RolloutConfig(max_turns=1, max_tokens_per_turn=24, max_response_tokens=64, max_obs_tokens=16,
                       invalid_action="none")
    proto = dataclasses.replace(SQL, tool_open=" zebra", tool_close=" giraffe")
    outs = []
    for mesh in (None, make_mesh((2, 1, 4))):
        base, ads = _policy(setup, mesh)
        agent = Agent(cfg, tok, proto, tool_for(SQL, SQLiteTool(timeout_s=5.0)), SamplingConfig(temperature=0.0),
                      rc, mesh=mesh)
        outs.append(agent.rollout(base, ads, prompts, list(range(len(prompts))), [{"db_path": DB}] * len(prompts)))
    a, b = outs
    assert a.tool_calls().sum() == 0 and (a.length > a.prompt_len).all()
    np.testing.assert_array_equal(a.ids, b.ids)
    np.testing.assert_allclose(a.sampler_logprobs, b.sampler_logprobs, atol=2e-5, rtol=0)


def test_decode_state_and_weight_copies_are_sharded(setup):
    cfg, _, _, _, tok, prompts = setup
    mesh = make_mesh((2, 1, 4))
    base, ads = _policy(setup, mesh)
    agent = Agent(cfg, tok, FREQUENT, tool_for(SQL, SQLiteTool(timeout_s=5.0)), SamplingConfig(temperature=1.0),
                  RolloutConfig(max_turns=1, max_tokens_per_turn=16, max_response_tokens=64, max_obs_tokens=16,
                                invalid_action="search_r1"),
                  mesh=mesh)
    assert agent.spec.placement == RolloutMesh.of(mesh)
    pol = SinglePolicy(agent, base, ads, prompts, seed=0)
    st = pol.state
    assert spec(st.cache["k"][0]) == ("data", "tensor", None, None)  # [B, K, H, S]
    assert spec(st.cache["v"][0]) == ("data", "tensor", None, None)  # [B, K, S, H]
    assert spec(st.cache["pos"]) == ("data", None)
    assert spec(st.pending) == ("data",) and spec(st.keys) == ("data", None)
    # each device holds a quarter of the batch × half of the KV heads... of 8 devices: 1/8 of the cache
    k = st.cache["k"][0]
    assert k.addressable_shards[0].data.size * 8 == k.size
    old = st.cache["k"][0]
    seg = pol.segment(np.ones(len(prompts), bool), np.ones((len(prompts), len(agent.spec.stops)), bool),
                      np.full(len(prompts), 8, np.int32), None)
    assert (seg.count > 0).all()
    assert spec(pol.state.cache["k"][0]) == ("data", "tensor", None, None)  # same layout, and
    assert old.is_deleted()  # the old cache was donated: updated in place, not copied
    # the decode layout's per-layer copies are placed as their stacked sources (minus the layer axis)
    layers = per_layer_params(base)
    assert spec(layers["layers"][0]["gate"]) == spec(base["layers"]["gate"])[1:] == (None, "tensor")
    assert spec(layers["head"]) == spec(base["embed"])[::-1] == (None, "tensor")
    np.testing.assert_array_equal(np.asarray(layers["head"]), np.asarray(base["embed"]).T)


def test_stacked_decode_layout_is_the_same_rollout(setup, single):
    """decode_layout="stacked" (no per-layer weight copy) computes the same rollout."""
    cfg, _, _, _, tok, prompts = setup
    mesh = make_mesh((2, 1, 4))
    base, ads = _policy(setup, mesh)
    rc = RolloutConfig(max_turns=2, max_tokens_per_turn=32, max_response_tokens=200, max_obs_tokens=48,
                       invalid_action="none", decode_layout="stacked")
    agent = Agent(cfg, tok, FREQUENT, tool_for(SQL, SQLiteTool(timeout_s=5.0)), SamplingConfig(temperature=1.0),
                  rc, mesh=mesh)
    tb = agent.rollout(base, ads, prompts, list(range(len(prompts))), [{"db_path": DB}] * len(prompts), seed=5)
    ref = single[1.0]
    np.testing.assert_array_equal(tb.ids, ref.ids)
    np.testing.assert_allclose(tb.sampler_logprobs, ref.sampler_logprobs, atol=2e-5, rtol=0)
    with pytest.raises(ValueError, match="decode_layout"):
        RolloutConfig(decode_layout="paged")


def test_a_share_of_the_batch_draws_as_the_whole_batch(setup):
    """Multi-host rollouts: a process rolling out rows [4, 8) with row_offset=4 samples what the whole
    8-row batch samples there (keys by global row; log-probs to the rounding of another padding)."""
    cfg, _, _, _, tok, prompts = setup
    base, ads = _policy(setup, None)
    rc = RolloutConfig(max_turns=2, max_tokens_per_turn=32, max_response_tokens=200, max_obs_tokens=48,
                       invalid_action="none")
    agent = Agent(cfg, tok, FREQUENT, tool_for(SQL, SQLiteTool(timeout_s=5.0)), SamplingConfig(temperature=1.0), rc)
    metas = [{"db_path": DB}] * len(prompts)
    whole = agent.rollout(base, ads, prompts, list(range(8)), metas, seed=5)
    halves = [agent.rollout(base, ads, prompts[o:o + 4], list(range(o, o + 4)), metas[o:o + 4], seed=5, row_offset=o)
              for o in (0, 4)]
    for o, h in zip((0, 4), halves):
        for i in range(4):
            n = int(whole.length[o + i])
            assert int(h.length[i]) == n
            np.testing.assert_array_equal(h.ids[i, :n], whole.ids[o + i, :n])
            np.testing.assert_allclose(h.sampler_logprobs[i, :n], whole.sampler_logprobs[o + i, :n], atol=2e-5)
    other = agent.rollout(base, ads, prompts[4:], list(range(4)), metas[4:], seed=5)  # no offset: other draws
    assert not np.array_equal(other.ids, halves[1].ids)
