"""Two-policy composition (rollout.compose): the reasoning policy writes outside tool spans (and
the opening tag), the tool policy writes the span through its closing tag, each keeps its own KV
cache, and a hand-off appends only what that cache has not seen.

Invariants, on a tiny random Llama with SmolLM2's tokenizer and the real SQLite tool: every sampled
token's log-prob equals one full forward of the policy that wrote it over the final ids (fp32,
atol 1e-4), the other policy's differs at > 90% of them; no policy runs its forward over a token twice; two identical
policies give exactly the single-policy trajectory for the same seed (ids, routes, turns; log-probs
within 5e-5: a hand-off draws from a chunked append instead of a one-token step). The tool tags are frequent
tokens (" the" opens, "." closes) whose output-head columns are scaled up so the tiny model writes them often;
which ids are tags is configuration."""

import dataclasses
import os

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from dart_jax.checkpoints.registry import load_model
from dart_jax.models.transformer import forward, hidden_states
from dart_jax.roles.router import route_roles
from dart_jax.rollout.agent import Agent, RolloutConfig, tool_for
from dart_jax.rollout.compose import Policy, TwoPolicies, compose_rollout, writers
from dart_jax.rollout.protocol import SQL
from dart_jax.rollout.sampling import SamplingConfig
from dart_jax.tokenization.tokenizer import encode_chat, load_tokenizer
from dart_jax.tools.sqlite_exec import SQLiteTool

ROOT = os.path.normpath(os.path.join(os.path.dirname(__file__), "..", ".."))
DB = os.path.join(ROOT, "data", "spider", "database", "concert_singer", "concert_singer.sqlite")
FREQUENT = dataclasses.replace(SQL, tool_open=" the", tool_close=".")
QUESTIONS = ["How many singers are there?", "List the names of all stadiums.", "What is the oldest singer's age?"]


@pytest.fixture(scope="module", params=["tiny", pytest.param("smollm2", marks=pytest.mark.slow)])
def setup(request):
    prompts_of = lambda tok: [encode_chat(tok, [{"role": "user", "content": q}]) for q in QUESTIONS]  # noqa: E731
    if request.param == "smollm2":  # the real model writes " the" and "." on its own
        cfg, base, tok = request.getfixturevalue("smollm2")
        other = jax.tree_util.tree_map(lambda x: x * 1.05 if x.ndim == 2 else x, base)
        prompts = [p for p in prompts_of(tok) for _ in range(2)]
        return cfg, base, other, tok, prompts
    path = request.getfixturevalue("tiny_smollm_dir")
    cfg, base = load_model(path)
    tok = load_tokenizer(path)
    the, dot = (tok.encode(t, add_special_tokens=False)[0] for t in (" the", "."))
    prompts = prompts_of(tok)
    # the tags' output columns along the mean final hidden state: logit ≈ 10 where a position's
    # state points that way, so each tag has probability ~0.1–0.2 (~2e-5 for an ordinary token)
    h, _ = hidden_states(base, None, jnp.asarray([prompts[0]]), jnp.arange(len(prompts[0]))[None], None, None, cfg=cfg)
    m = np.asarray(h[0].mean(0), np.float32)
    head = np.array(base["lm_head"])
    head[:, the] = 10.0 * m / (m @ m)
    head[:, dot] = 10.0 * m / (m @ m)
    base = dict(base, lm_head=jnp.asarray(head))
    other = jax.tree_util.tree_map(lambda x: x * 1.1 if x.ndim == 2 else x, base)  # a second, different model
    prompts = [p for p in prompts for _ in range(2)]  # groups of 2: the shared prefill path
    return cfg, base, other, tok, prompts


def make_agent(cfg, tok, temperature=1.0, **sampling):
    rc = RolloutConfig(max_turns=2, max_tokens_per_turn=40, max_response_tokens=240, max_obs_tokens=48,
                       invalid_action="none")
    return Agent(cfg, tok, FREQUENT, tool_for(SQL, SQLiteTool(timeout_s=5.0)),
                 SamplingConfig(temperature=temperature, **sampling), rc)


def teacher_forced(cfg, base, tb, b):
    n = tb.length[b]
    logits, _ = forward(base, None, jnp.asarray(tb.ids[b:b + 1, :n]), jnp.asarray(tb.positions[b:b + 1, :n]),
                        None, None, cfg=cfg)
    lp = np.asarray(jax.nn.log_softmax(logits[0].astype(jnp.float32)))
    gen = np.nonzero(tb.loss_mask[b, :n])[0]
    return gen, lp[gen - 1, tb.ids[b, gen]]


def test_observation_appends_at_a_multiple_of_eight_columns_give_the_same_trajectories(setup, monkeypatch):
    """rollout.obs_multiple: an append's columns are its longest observation rounded up to a multiple of 8
    instead of a power of two; the padding is masked, so the same tokens, log-probs to rounding."""
    from dart_jax.rollout.agent import SinglePolicy, obs_columns
    cfg, base, _, tok, prompts = setup
    metas = [{"db_path": DB}] * len(prompts)
    widths: list[int] = []
    observe = SinglePolicy.observe
    monkeypatch.setattr(SinglePolicy, "observe", lambda self, obs, *a: widths.append(obs.shape[1]) or
                        observe(self, obs, *a))
    out = {}
    for k in (0, 8):
        agent = make_agent(cfg, tok)
        agent.rc = dataclasses.replace(agent.rc, obs_multiple=k)
        widths.clear()
        out[k] = (agent.rollout(base, None, prompts, list(range(len(prompts))), metas, seed=3), list(widths))
    (a, wa), (b, wb) = out[0], out[8]
    assert a.tool_calls().sum() >= 2 and len(wa) == len(wb) >= 1
    assert all(w % 8 == 0 for w in wb) and all(x <= y for x, y in zip(wb, wa)) and sum(wb) < sum(wa), (wa, wb)
    np.testing.assert_array_equal(b.ids, a.ids)
    np.testing.assert_array_equal(b.loss_mask, a.loss_mask)
    # fp32 rounding of other matmul shapes (1.5e-5 seen on SmolLM2, the slow variant)
    np.testing.assert_allclose(b.sampler_logprobs, a.sampler_logprobs, atol=5e-5)
    rc = make_agent(cfg, tok).rc  # the cap (48 here) bounds either rule; 0 keeps the power-of-two buckets
    assert [obs_columns(n, rc) for n in (5, 17, 33, 47)] == [16, 32, 48, 48]
    rc8 = dataclasses.replace(rc, obs_multiple=8)
    assert [obs_columns(n, rc8) for n in (5, 17, 33, 47, 90)] == [8, 24, 40, 48, 48]
    with pytest.raises(ValueError, match="obs_multiple=4: 0 .* or ≥ 8"):  # widths (programs) stay bounded
        dataclasses.replace(rc, obs_multiple=4)


def test_identical_policies_give_the_single_policy_trajectory(setup):
    cfg, base, _, tok, prompts = setup
    metas = [{"db_path": DB}] * len(prompts)
    uids = list(range(len(prompts)))
    agent = make_agent(cfg, tok)
    single = agent.rollout(base, None, prompts, uids, metas, seed=3)
    pol = Policy(cfg, base)
    both = compose_rollout(agent, pol, pol, prompts, uids, metas, seed=3)
    assert single.tool_calls().sum() >= 2, single.turns  # the tags are frequent: spans and tool calls happen
    np.testing.assert_array_equal(both.ids, single.ids)
    np.testing.assert_array_equal(both.loss_mask, single.loss_mask)
    np.testing.assert_array_equal(both.route_ids, single.route_ids)
    # the first token of a turn comes from a chunked append, not a one-token step: fp32 rounding
    np.testing.assert_allclose(both.sampler_logprobs, single.sampler_logprobs, atol=5e-5)
    assert both.finish_reason == single.finish_reason and both.turns == single.turns


def test_each_token_is_its_writers_and_no_token_is_encoded_twice(setup):
    cfg, base, other, tok, prompts = setup
    metas = [{"db_path": DB}] * len(prompts)
    agent = make_agent(cfg, tok)
    dec = TwoPolicies(agent, Policy(cfg, base), Policy(cfg, other), prompts, seed=5)
    tb = agent.run(dec, prompts, list(range(len(prompts))), metas)
    assert tb.tool_calls().sum() >= 2, tb.turns
    # the loop's own account (Agent.time): a segment per turn, every sampled token kept once; the two
    # policies' decode calls counted one by one (a turn's longest row alone would undercount: rows
    # handed off mid-turn ran a call per policy), their hand-off appends as appends
    t = agent.time
    assert t["segments"] == max(len(turns) for turns in tb.turns)
    assert t["kept_tokens"] == int(tb.loss_mask.sum())
    per_turn = [max(turns[k]["tokens"] for turns in tb.turns if len(turns) > k) for k in range(t["segments"])]
    assert t["decode_steps"] > sum(per_turn)
    assert t["appends"] == sum(dec.appends) and t["append_s"] > 0 and t["decode_s"] > 0 and t["tool_s"] > 0
    n_tool = 0
    for b in range(tb.batch_size):
        n = tb.length[b]
        np.testing.assert_array_equal(tb.route_ids[b, :n], np.asarray(route_roles(jnp.asarray(tb.ids[b:b + 1, :n]),
                                                                                  agent.spec.router))[0])
        gen, lp_r = teacher_forced(cfg, base, tb, b)
        _, lp_t = teacher_forced(cfg, other, tb, b)
        w = writers(tb.ids[b, :n], int(tb.prompt_len[b]), agent.spec.router)[gen]
        want = np.where(w == 1, lp_t, lp_r)
        np.testing.assert_allclose(tb.sampler_logprobs[b, gen], want, atol=1e-4)
        assert np.mean(np.abs(lp_t - lp_r) > 1e-3) > 0.9  # the two models really differ (near-certain tokens aside)
        n_tool += int((w == 1).sum())
        # each policy ran its forward over each trajectory token at most once (the last one never):
        # its KV cache holds every position < consumed exactly once, and nothing else
        assert dec.consumed[:, b].max() <= n - 1, (dec.consumed[:, b], n)
        for w in (0, 1):
            pos = np.asarray(dec.states[w].cache["pos"])[b]
            pos = np.sort(pos[pos >= 0])
            np.testing.assert_array_equal(pos, np.arange(dec.consumed[w, b]))
    # hand-offs both ways: the reasoning policy synced at its first draw and again after a span
    assert n_tool >= 4 and dec.appends[0] >= 2 and dec.appends[1] >= 1


@pytest.mark.slow  # CI budget: kept out of the default run (python -m pytest -m slow)
def test_two_agent_training_log_probs_are_the_writers_sampled_ones(setup):
    """What the 2-Agent trainer scores (rl.step on a TwoModels, by the loss roles of the recorded
    routes) equals what each writer sampled, token by token, with two different models."""
    from dart_jax.adapters.method import TwoModels
    from dart_jax.rl.step import sequence_logprobs
    from dart_jax.rollout.compose import rollout_policy
    cfg, base, other, tok, prompts = setup
    agent = make_agent(cfg, tok)
    metas = [{"db_path": DB}] * len(prompts)
    tb = rollout_policy(agent, TwoModels(base, other), None, prompts, list(range(len(prompts))), metas, seed=3)
    tool_tokens = 0
    for b in range(tb.batch_size):
        n = int(tb.length[b])
        logp, _ = sequence_logprobs(TwoModels(base, other), None, jnp.asarray(tb.ids[b:b + 1, :n]),
                                    jnp.asarray(tb.positions[b:b + 1, :n]), jnp.asarray(tb.route_ids[b:b + 1, :n]),
                                    cfg=cfg, temperature=1.0, chunk=128)
        gen = np.nonzero(tb.loss_mask[b, :n])[0]
        np.testing.assert_allclose(np.asarray(logp)[0, gen], tb.sampler_logprobs[b, gen], atol=1e-4)
        tool_tokens += int((writers(tb.ids[b, :n], int(tb.prompt_len[b]), agent.spec.router)[gen] == 1).sum())
    assert tool_tokens >= 5  # the tool model wrote some of them


def test_answer_only_segment_and_a_turn_that_starts_inside_a_span(setup):
    """One tool call allowed and Search-R1's corrective message for invalid turns: spans close in the
    answer-only segment (control returns without a call) and turns start inside a span (the tool
    policy ran out of budget in it); log-probs stay the writer's."""
    cfg, base, other, tok, prompts = setup
    rc = RolloutConfig(max_turns=1, max_tokens_per_turn=40, max_response_tokens=240, max_obs_tokens=48,
                       invalid_action="search_r1")
    agent = Agent(cfg, tok, FREQUENT, tool_for(SQL, SQLiteTool(timeout_s=5.0)), SamplingConfig(temperature=1.0), rc)
    seen = []
    for seed in range(4):  # the events are likely, not certain, for one seed: stop once both occurred
        dec = TwoPolicies(agent, Policy(cfg, base), Policy(cfg, other), prompts, seed=seed)
        tb = agent.run(dec, prompts, list(range(len(prompts))), [{"db_path": DB}] * len(prompts))
        seen.append(dict(dec.events))
        if dec.events["span_closed_no_call"] and dec.events["turn_started_inside"]:
            break
    assert dec.events["span_closed_no_call"] >= 1 and dec.events["turn_started_inside"] >= 1, seen
    for b in range(tb.batch_size):
        n = tb.length[b]
        gen, lp_r = teacher_forced(cfg, base, tb, b)
        _, lp_t = teacher_forced(cfg, other, tb, b)
        w = writers(tb.ids[b, :n], int(tb.prompt_len[b]), agent.spec.router)[gen]
        np.testing.assert_allclose(tb.sampler_logprobs[b, gen], np.where(w == 1, lp_t, lp_r), atol=1e-4)


def test_writers_follow_the_hand_off_rule():
    from dart_jax.roles.router import RouterSpec
    router = RouterSpec((7,), (8,))
    ids = np.array([1, 2, 3, 4, 7, 5, 6, 8, 9, 9, 7, 8, 3])
    #                prompt   R  R(open) T  T  T(close) obs obs R(open) T(close) R
    w = writers(ids, 3, router)
    assert w.tolist() == [-1, -1, -1, 0, 0, 1, 1, 1, 0, 0, 0, 1, 0]


def test_routed_mode_assembles_one_dart_tree(tiny_smollm_dir):
    from dart_jax.adapters.method import MethodSpec, init_adapters
    from dart_jax.models.config import config_from_hf_dir
    from dart_jax.rollout.compose import routed_adapters
    cfg = config_from_hf_dir(tiny_smollm_dir)
    lora = init_adapters(MethodSpec("lora", rank=4, alpha=8.0), cfg, jax.random.PRNGKey(1))["shared"]
    tpl = init_adapters(MethodSpec("dart", rank=4), cfg, jax.random.PRNGKey(2))
    tree = routed_adapters(None, lora, tpl)  # H_Tool over one base: bare base reasons, the LoRA writes tool spans
    assert tree["tool"] is lora and tree["tool"].scale == lora.scale
    assert all(float(jnp.abs(x).max()) == 0.0 for x in jax.tree_util.tree_leaves(tree["reasoning"].params))
    with pytest.raises(ValueError, match="shapes differ"):
        routed_adapters(init_adapters(MethodSpec("lora", rank=8), cfg, jax.random.PRNGKey(1))["shared"], None, tpl)
    with pytest.raises(ValueError, match="need a DART tree"):
        routed_adapters(None, None, {"shared": lora})


@pytest.mark.slow  # every re-encode hand-off compiles a new prefill width
def test_handoff_bench_runs_both_ways(tiny_smollm_dir):
    """launch.bench handoff's two sides complete the same plan (timings are not asserted: never in tests)."""
    from dart_jax.bench.sampler import bench_handoff
    res = bench_handoff(tiny_smollm_dir, prompt_len=16, turns=2, reason_len=4, span_len=4, obs_len=8, repeats=1)
    assert len(res["ttft_append_s"]) == len(res["ttft_reencode_s"]) == 2 * 2 + 1
    assert res["append_s"] > 0 and res["reencode_s"] > 0 and res["ratio"]["rounds"] == 1


@pytest.mark.parametrize("two", [False, True], ids=["one_policy", "two_policies"])
def test_gathering_the_running_rows_changes_no_trajectory(setup, monkeypatch, two):
    """rollout.gather in the batch agent loop: once a batch's running (or appending, or writing) rows fit a
    smaller bucket, only they are decoded / appended. The trajectories equal the whole batch's decode
    with a mask (ids, routes, masks, finishes, turns exact; log-probs 2e-5: a batch of U rows rounds its
    matmuls as U rows do), and the gathered paths did run."""
    from dart_jax.rollout import gather
    cfg, base, other, tok, prompts = setup
    if not gather.gather_fits(cfg.num_layers):
        pytest.skip("vm.max_map_count holds too few of this model's programs to gather (gather_fits)")
    metas = [{"db_path": DB}] * len(prompts)
    uids = list(range(len(prompts)))
    calls = {"decode_rows": [], "append_rows": []}
    for name in calls:
        real = getattr(gather, name)

        def spy(*a, _real=real, _name=name, **k):
            calls[_name].append(int(np.sum(np.asarray(a[3]) < len(prompts))))  # rows run (a[3]: `rows`)
            return _real(*a, **k)
        monkeypatch.setattr(gather, name, spy)
    out = {}
    for g in (0, 2):
        agent = make_agent(cfg, tok)
        agent.rc = dataclasses.replace(agent.rc, gather_rows=g)
        if two:
            out[g] = compose_rollout(agent, Policy(cfg, base), Policy(cfg, other), prompts, uids, metas, seed=7)
        else:
            out[g] = agent.rollout(base, None, prompts, uids, metas, seed=7)
        if g == 0:
            assert calls == {"decode_rows": [], "append_rows": []}
    whole, gathered = out[0], out[2]
    assert calls["decode_rows"] and calls["append_rows"], calls  # rows finished or paused: gathered
    assert max(calls["decode_rows"] + calls["append_rows"]) <= 4 < len(prompts)
    assert whole.tool_calls().sum() >= 1, whole.turns  # a row paused for its tool and came back
    np.testing.assert_array_equal(gathered.ids, whole.ids)
    np.testing.assert_array_equal(gathered.loss_mask, whole.loss_mask)
    np.testing.assert_array_equal(gathered.route_ids, whole.route_ids)
    np.testing.assert_allclose(gathered.sampler_logprobs, whole.sampler_logprobs, atol=2e-5)
    assert gathered.finish_reason == whole.finish_reason and gathered.turns == whole.turns


def test_gathering_stays_off_where_the_memory_map_limit_is_low(tmp_path, caplog):
    """Gathering compiles more programs; XLA:CPU fails past vm.max_map_count, so a limit that holds few of
    the model's programs (Linux's default for SmolLM2's 30 layers: ~46) leaves batches whole, said once."""
    from dart_jax.rollout import gather
    low, high = tmp_path / "low", tmp_path / "high"
    low.write_text("65530\n")
    high.write_text("1048576\n")
    assert gather.map_count_holds(30, str(low)) == (65530, 46)
    with caplog.at_level("INFO", logger="dart_jax.rollout.gather"):
        assert not gather.gather_fits(30, str(low)) and not gather.gather_fits(30, str(low))
        assert gather.gather_fits(30, str(high))
    assert caplog.text.count("vm.max_map_count = 65530") == 1
    mask = np.array([True, False, False, False, False, False, False, False])
    rows = gather.gather_plan(mask, 8, None, 2)  # this host's limit holds a 2-layer model's programs
    assert rows is not None and rows.tolist() == [0]
    assert gather.gather_plan(mask, 0, None, 2) is None and gather.gather_plan(mask, 9, None, 2) is None
    assert gather.gather_plan(np.ones(8, bool), 8, None, 2) is None  # the whole batch runs


def test_an_observation_at_its_cap_appends_the_cap_not_the_bucket_above(setup, monkeypatch):
    """A batch's observations are appended at the bucket of the longest, but never wider than the cap (to a
    multiple of 16): capped 40-token observations take 48 columns (and 49 cache slots), not 64. The
    trajectory is what a full forward over it gives (log-probs 1e-4)."""
    from dart_jax.rollout.agent import SinglePolicy
    from dart_jax.rollout.sampler import cache_used
    cfg, base, _, tok, prompts = setup
    rc = RolloutConfig(max_turns=2, max_tokens_per_turn=40, max_response_tokens=240, max_obs_tokens=40,
                       invalid_action="none")
    long_body = " ".join(["passage"] * 200)  # far past the cap: every observation is cut to 40 tokens
    agent = Agent(cfg, tok, FREQUENT, lambda queries, metas: [long_body] * len(queries),
                  SamplingConfig(temperature=1.0), rc)
    widths = []
    real = SinglePolicy.observe

    def spy(self, obs, obs_len, do, resp):
        before = cache_used(self.state)
        out = real(self, obs, obs_len, do, resp)
        # (columns, longest observation, cache slots the append took: the pending token + the columns)
        widths.append((obs.shape[1], int(obs_len.max()), cache_used(self.state) - before))
        return out
    monkeypatch.setattr(SinglePolicy, "observe", spy)
    tb = agent.rollout(base, None, prompts, list(range(len(prompts))), [{}] * len(prompts), seed=5)
    assert tb.tool_calls().sum() >= 1, tb.turns
    assert widths and all(w == 48 and n == 40 and used == 49 for w, n, used in widths), widths
    for b in range(tb.batch_size):
        gen, lp = teacher_forced(cfg, base, tb, b)
        np.testing.assert_allclose(tb.sampler_logprobs[b, gen], lp, atol=1e-4)


SETTINGS = {"greedy": dict(temperature=0.0), "sampled": dict(temperature=1.0),
            "filtered": dict(temperature=0.7, top_p=0.9, top_k=20)}


@pytest.mark.parametrize("setting,two", [("greedy", False), ("filtered", False), ("sampled", True)],
                         ids=["greedy", "filtered", "sampled_two_policies"])
def test_sampling_as_data_draws_what_a_compiled_setting_draws(setup, setting, two):
    """The agent carries temperature and top-p in the decode state (Agent.row_sampling), not in the
    compiled programs: its trajectories equal those of a sampler spec holding the setting (the form
    before; ids, masks, routes, finishes exact, log-probs 1e-6): greedy and at T = 0.7 with top-p 0.9
    and top-k 20 for one policy, at T = 1 for the two-model composition (the quickstart's T = 1 one-policy
    rollouts: its 384 trajectories, docs/results/quickstart.md)."""
    cfg, base, other, tok, prompts = setup
    metas = [{"db_path": DB}] * len(prompts)
    uids = list(range(len(prompts)))
    out = []
    for compiled in (False, True):
        agent = make_agent(cfg, tok, **SETTINGS[setting])
        if compiled:  # the state carries no settings: spec.sampling draws
            agent.spec = dataclasses.replace(agent.spec, sampling=SamplingConfig(**SETTINGS[setting]))
            agent.row_sampling = lambda b: None
        if two:
            out.append(compose_rollout(agent, Policy(cfg, base), Policy(cfg, other), prompts, uids, metas, seed=11))
        else:
            out.append(agent.rollout(base, None, prompts, uids, metas, seed=11))
    as_data, before = out
    if setting != "greedy":  # greedy, the tiny model writes the closing tag first (an invalid action)
        assert as_data.tool_calls().sum() >= 1, as_data.turns
    np.testing.assert_array_equal(as_data.ids, before.ids)
    np.testing.assert_array_equal(as_data.loss_mask, before.loss_mask)
    np.testing.assert_array_equal(as_data.route_ids, before.route_ids)
    np.testing.assert_allclose(as_data.sampler_logprobs, before.sampler_logprobs, rtol=0, atol=1e-6)
    assert as_data.finish_reason == before.finish_reason and as_data.turns == before.turns


def test_a_greedy_batch_runs_the_sampled_batchs_programs(setup):
    """A held-out check (greedy) and a training rollout (T = 1) build one sampler spec, so every sampler
    program (prefill, decode, append, gathered rows) keys on the shapes alone; here the greedy batch
    after the sampled one of as many rows compiles no decode program of its own (greedy ends at its
    first token, so appends are not reached; a prompt batch of distinct prompts prefills in place where
    a GRPO group's is broadcast, another program)."""
    from dart_jax.rollout import gather, sampler
    cfg, base, _, tok, prompts = setup
    metas = [{"db_path": DB}] * len(prompts)
    uids = list(range(len(prompts)))
    sampled, greedy = make_agent(cfg, tok, 1.0), make_agent(cfg, tok, 0.0)
    assert sampled.spec == greedy.spec and hash(sampled.spec) == hash(greedy.spec)
    sampled.rollout(base, None, prompts, uids, metas, seed=13)
    fns = (sampler.decode_segment, gather.decode_rows)
    sizes = [f._cache_size() for f in fns]
    out = greedy.rollout(base, None, prompts, uids, metas, seed=13)
    assert len(out.ids) == len(prompts)
    assert [f._cache_size() for f in fns] == sizes
