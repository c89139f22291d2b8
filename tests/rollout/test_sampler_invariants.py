"""Sampler invariants on tiny random models: decode → pause → append → resume equals one forward
over the concatenated ids (sampled log-probs and argmax), and recorded routes equal the router
applied to the final ids."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import tiny_models
from dart_jax.adapters.method import MethodSpec, init_adapters
from dart_jax.checkpoints.registry import load_model
from dart_jax.models.cache import init_cache
from dart_jax.models.generate import left_pad
from dart_jax.models.transformer import forward, per_layer_params
from dart_jax.roles.router import RouterSpec, route_roles
from dart_jax.rollout.sampler import LENGTH, STOPPED, SamplerSpec, append, decode_segment, prefill
from dart_jax.rollout.sampling import SamplingConfig

OPEN, CLOSE = 20, 21  # frequent ids in the tiny vocab play the tool tags


@pytest.fixture(scope="module")
def model(tmp_path_factory):
    path = str(tmp_path_factory.mktemp("tiny_qwen3_sampler"))
    tiny_models.build("qwen3", path)
    cfg, base = load_model(path)
    ads = init_adapters(MethodSpec("dart", rank=4), cfg, jax.random.PRNGKey(0))
    ads = {n: a.replace(params=jax.tree_util.tree_map(lambda x: x + 0.05, a.params)) for n, a in ads.items()}
    return cfg, base, ads


def run_episode(cfg, base, ads, sampling, seed=0, route_mode="role"):
    """prompt -> segment -> append obs -> segment -> append -> segment; returns host lists."""
    spec = SamplerSpec(cfg, RouterSpec((OPEN,), (CLOSE,)), sampling, stops=((CLOSE,), (7, 8)), route_mode=route_mode)
    prompts = [[5, 6, OPEN, 9, 10], [11, 12, 13, 14, 15, 16, 17, 18], [30, 31]]
    tokens, positions = left_pad(prompts, 0)
    b = len(prompts)
    cache = init_cache(cfg, b, 128)
    state, prompt_routes = prefill(base, ads, tokens, positions, cache, jax.random.PRNGKey(seed), spec=spec)
    rows = [dict(ids=list(p), lp=[0.0] * len(p), gen=[False] * len(p),
                 routes=list(np.asarray(prompt_routes)[i][-len(p):]))
            for i, p in enumerate(prompts)]
    rng = np.random.default_rng(seed)
    active = jnp.asarray([True, True, False])
    finishes = []
    for turn in range(3):
        state, seg = decode_segment(base, ads, state, active, jnp.ones((b, 2), bool), jnp.asarray([6, 4, 5]),
                                    spec=spec, length=16)
        seg = jax.device_get(seg)
        finishes.append(seg.finish.tolist())
        for i in range(b):
            n = int(seg.count[i])
            rows[i]["ids"] += seg.tokens[i, :n].tolist()
            rows[i]["lp"] += seg.logprobs[i, :n].tolist()
            rows[i]["routes"] += seg.routes[i, :n].tolist()
            rows[i]["gen"] += [True] * n
            rows[i].setdefault("segs", []).append(seg.tokens[i, :n].tolist())
        obs_len = rng.integers(1, 6, b)
        obs = rng.integers(3, 128, (b, 8)).astype(np.int32)
        obs[0, 0] = CLOSE  # an observation may contain tags: the router must follow them too
        do = np.asarray(active) & (turn < 2)
        state, obs_routes = append(base, ads, state, jnp.asarray(obs), jnp.asarray(obs_len), jnp.asarray(do), spec=spec)
        for i in range(b):
            if do[i]:
                rows[i]["ids"] += obs[i, :obs_len[i]].tolist()
                rows[i]["lp"] += [0.0] * int(obs_len[i])
                rows[i]["routes"] += np.asarray(obs_routes)[i, :obs_len[i]].tolist()
                rows[i]["gen"] += [False] * int(obs_len[i])
    return spec, rows, finishes


@pytest.mark.parametrize("sampling", [SamplingConfig(temperature=0.0), SamplingConfig(temperature=1.0),
                                      SamplingConfig(temperature=0.7, top_k=20, top_p=0.9)])
def test_resume_equals_teacher_forced_forward(model, sampling):
    cfg, base, ads = model
    spec, rows, finishes = run_episode(cfg, base, ads, sampling)
    assert finishes[0][2] == 0 and all(f in (STOPPED, LENGTH) for f in finishes[0][:2])
    for r in rows[:2]:
        ids = jnp.asarray([r["ids"]])
        pos = jnp.arange(len(r["ids"]))[None]
        routes = route_roles(ids, spec.router)
        np.testing.assert_array_equal(np.asarray(routes)[0], np.asarray(r["routes"]))
        logits, _ = forward(base, ads, ids, pos, routes, None, cfg=cfg)
        z = np.asarray(logits[0], np.float64) / sampling.logprob_temperature
        lp = z - np.log(np.exp(z - z.max(-1, keepdims=True)).sum(-1, keepdims=True)) - z.max(-1, keepdims=True)
        gen = np.nonzero(r["gen"])[0]
        assert len(gen) >= 8
        teacher = lp[gen - 1, np.asarray(r["ids"])[gen]]
        np.testing.assert_allclose(np.asarray(r["lp"])[gen], teacher, atol=2e-5)
        if sampling.greedy:
            np.testing.assert_array_equal(z[gen - 1].argmax(-1), np.asarray(r["ids"])[gen])
    assert rows[2]["ids"] == [30, 31]  # the inactive row got nothing


def test_stop_sequences_and_budgets(model):
    cfg, base, ads = model
    budgets = [6, 4]
    seen = set()
    for seed in range(20):  # every episode is checked; sample until both finish kinds occurred
        spec, rows, finishes = run_episode(cfg, base, ads, SamplingConfig(temperature=1.0), seed=seed)
        for turn, fin in enumerate(finishes):
            for i in range(2):
                seg = rows[i]["segs"][turn]
                seen.add(fin[i])
                stopped_here = [k for k in range(len(seg)) if seg[k] == CLOSE or seg[max(0, k - 1):k + 1] == [7, 8]]
                if fin[i] == STOPPED:
                    assert stopped_here == [len(seg) - 1]   # stops exactly at the first stop sequence
                else:
                    assert fin[i] == LENGTH and len(seg) == budgets[i] and not stopped_here
        if {STOPPED, LENGTH} <= seen:
            break
    assert {STOPPED, LENGTH} <= seen


def test_per_layer_decode_layout_matches_stacked_and_is_memoised(model):
    """The sampler's layout (`per_layer_params`: per-layer weight buffers, a [D, V] head copy for
    tied embeddings) gives the same episode as the stacked base sliced inside the jit, and is
    converted once per base: reused for the same arrays, rebuilt when a weight array changes."""
    cfg, base, ads = model
    fast = per_layer_params(base)
    assert isinstance(fast["layers"], tuple) and len(fast["layers"]) == cfg.num_layers
    assert per_layer_params(base)["layers"] is fast["layers"]
    assert per_layer_params(fast) is fast
    if cfg.tie_word_embeddings:
        np.testing.assert_array_equal(np.asarray(fast["head"]), np.asarray(base["embed"]).T)
    sampling = SamplingConfig(temperature=1.0)
    _, rows_a, fin_a = run_episode(cfg, base, ads, sampling, seed=3)
    _, rows_b, fin_b = run_episode(cfg, fast, ads, sampling, seed=3)
    assert fin_a == fin_b
    for a, b in zip(rows_a, rows_b):
        assert a["ids"] == b["ids"] and a["routes"] == b["routes"]
        np.testing.assert_allclose(a["lp"], b["lp"], atol=1e-6)
    changed = dict(base, embed=base["embed"] + 1.0)
    again = per_layer_params(changed)
    assert again["layers"] is not fast["layers"]
    if cfg.tie_word_embeddings:
        np.testing.assert_array_equal(np.asarray(again["head"]), np.asarray(changed["embed"]).T)


def test_draws_keyed_by_row_and_position_not_by_schedule(model):
    """T = 1 draws depend on (seed, row, position) only: one 12-token segment equals a 6-token segment,
    an append of nothing (it consumes the pending token and draws the next, as a hand-off between
    two policies does) and another 6-token segment; a row's tokens do not change when another row
    of the batch does."""
    cfg, base, ads = model
    spec = SamplerSpec(cfg, RouterSpec((OPEN,), (CLOSE,)), SamplingConfig(temperature=1.0), stops=((250, 251),))

    def run(prompts, budgets):
        tokens, positions = left_pad(prompts, 0)
        b = len(prompts)
        state, _ = prefill(base, ads, tokens, positions, init_cache(cfg, b, 64), jax.random.PRNGKey(3), spec=spec)
        out = [[] for _ in range(b)]
        for k, n in enumerate(budgets):
            if k:
                state, _ = append(base, ads, state, jnp.zeros((b, 16), jnp.int32), jnp.zeros((b,), jnp.int32),
                                  jnp.ones((b,), bool), spec=spec)
            state, seg = decode_segment(base, ads, state, jnp.ones((b,), bool), jnp.ones((b, 1), bool),
                                        jnp.full((b,), n), spec=spec, length=16)
            seg = jax.device_get(seg)
            for i in range(b):
                out[i] += seg.tokens[i, :int(seg.count[i])].tolist()
        return out

    one = run([[5, 6, 7, 9], [11, 12, 13]], [12])
    assert len(one[0]) == 12 and one[0] != one[1]
    assert run([[5, 6, 7, 9], [11, 12, 13]], [6, 6]) == one
    assert run([[5, 6, 7, 9], [40, 41, 42, 43, 44, 45]], [12])[0] == one[0]


def test_mixlora_decode_equals_teacher_forced_forward(model):
    """MixLoRA routes per token in decode as in training: the router mixes each generated token's
    experts from its own hidden state, through pauses and appends (shared route mode)."""
    cfg, base, _ = model
    ads = init_adapters(MethodSpec("mixlora", rank=4, experts=3, top_k=2), cfg, jax.random.PRNGKey(1))
    ads = {n: a.replace(params=jax.tree_util.tree_map(lambda x: x + 0.05, a.params)) for n, a in ads.items()}
    sampling = SamplingConfig(temperature=1.0)
    spec, rows, _ = run_episode(cfg, base, ads, sampling, route_mode="shared")
    for r in rows[:2]:
        ids = jnp.asarray([r["ids"]])
        routes = spec.routes(route_roles(ids, spec.router))
        np.testing.assert_array_equal(np.asarray(routes)[0], np.asarray(r["routes"]))
        logits, _ = forward(base, ads, ids, jnp.arange(len(r["ids"]))[None], routes, None, cfg=cfg)
        lp = np.asarray(jax.nn.log_softmax(logits[0].astype(jnp.float32)), np.float64)
        gen = np.nonzero(r["gen"])[0]
        assert len(gen) >= 8
        np.testing.assert_allclose(np.asarray(r["lp"])[gen], lp[gen - 1, np.asarray(r["ids"])[gen]], atol=2e-5)
