"""The continuous-batching engine (dart_jax/serve/engine.py): a request's trajectory under continuous
batching — other requests arriving, pausing for the real tool and leaving around it — equals the same
request rolled out alone by the batch-synchronous agent loop (rollout.agent), token for token.

A tiny random Llama with SmolLM2's tokenizer and a protocol whose tool tags are frequent tokens
(" the" opens, "." closes), so random text makes tool calls; the tool is the real lexical retriever
over lab world 1's corpus. Tolerances: ids, routes, finish and turns exact; log-probs 2e-5 (the batch
of 1 and the batch of `slots` rows round their matmuls differently)."""


import numpy as np
import pytest

from dart_jax.rollout.agent import Agent
from dart_jax.rollout.sampling import SamplingConfig
from dart_jax.serve.engine import Engine, Overloaded, Request
from serve_setup import RC


def _alone(agent, base, prompt, temperature, seed):
    a = Agent(agent.spec.model, agent.tok, agent.protocol, agent.tool, SamplingConfig(temperature=temperature), RC)
    tb = a.rollout(base, None, [prompt], ["q"], seed=seed)
    n, p = int(tb.length[0]), int(tb.prompt_len[0])
    return {"ids": tb.ids[0, p:n].tolist(), "routes": tb.route_ids[0, p:n].tolist(),
            "mask": tb.loss_mask[0, p:n].tolist(), "logprobs": tb.sampler_logprobs[0, p:n],
            "finish": tb.finish_reason[0], "turns": tb.turns[0]}


def _same(got: dict, want: dict):
    assert got["ids"] == want["ids"]
    assert got["routes"] == want["routes"]
    assert got["mask"] == want["mask"]
    assert got["finish"] == want["finish"]
    assert [(t["action"], t["query"], t["observation"]) for t in got["turns"]] == \
        [(t["action"], t["query"], t["observation"]) for t in want["turns"]]
    np.testing.assert_allclose(np.asarray(got["logprobs"]), want["logprobs"], atol=2e-5)


def test_continuous_batching_equals_each_request_alone(serve_setup):
    agent, base, prompts = serve_setup
    settings = [(1.0, 11), (0.0, 0), (0.7, 5), (1.0, 3), (1.0, 11), (0.5, 9)]
    # five slots: three running rows decode gathered into a bucket of four (one padding row), five as the batch
    engine = Engine(agent, base, None, slots=5, segment=8, tool_workers=2)
    gens = [engine.submit(Request(tuple(prompts[k]), temperature=t, seed=s))
            for k, (t, s) in enumerate(settings[:3])]
    # the rest arrive while the first ones are decoding / paused for the tool
    for _ in range(3):
        engine.step()
    gens += [engine.submit(Request(tuple(prompts[k]), temperature=t, seed=s))
             for k, (t, s) in enumerate(settings[3:], 3)]
    engine.run_until_idle(timeout=600)
    results = [g.result(timeout=1) for g in gens]
    assert engine.stats["admits"] >= 2 and engine.stats["appends"] >= 1, engine.stats
    # prompts and observations are encoded in exact pieces (three prompts on five slots: 2 + 1), no padding row
    assert engine.stats["prefill_rows"] == engine.stats["admitted"] == 6, engine.stats
    # some segments decoded fewer rows than the slots, gathered (rollout.gather.decode_rows): the first three
    # requests (a padded bucket of four), and the last ones as the others finish
    assert engine.stats["segment_rows"] < 5 * engine.stats["segments"], engine.stats
    assert sum(r["tool_calls"] for r in results) >= 3, [r["turns"] for r in results]
    for k, r in enumerate(results):
        _same(r, _alone(agent, base, prompts[k], *settings[k]))


def test_kv_slots_allocated_up_front_change_nothing(serve_setup):
    """`capacity` allocated at construction (launch.serve --capacity; the serving benchmark): the first
    step donates a state no growth has rebuilt, and the requests equal their decode alone."""
    agent, base, prompts = serve_setup
    settings = [(1.0, 11), (0.0, 0), (0.7, 5)]
    engine = Engine(agent, base, None, slots=2, segment=8, capacity=1024)
    gens = [engine.submit(Request(tuple(prompts[k]), temperature=t, seed=s)) for k, (t, s) in enumerate(settings)]
    engine.run_until_idle(timeout=600)
    assert engine.capacity() == 1024 and engine.stats["cache_grows"] == 0, engine.stats
    for k, g in enumerate(gens):
        _same(g.result(timeout=1), _alone(agent, base, prompts[k], *settings[k]))


INSTRUCTION = ("Answer the question about the fictional world. Search for each entity you need by its name, one "
               "search at a time, state what each passage told you, then give the answer. Question: ")


def test_a_shared_prompt_prefix_is_prefilled_once_and_changes_nothing(serve_setup):
    """Prompts sharing a long instruction: the engine learns the prefix from the first two, prefills it
    once and starts later requests from its KV slots; every request equals its decode alone (the whole
    prompt prefilled), token for token."""
    from dart_jax.serve.slots import PREFIX_STEP, common_prefix
    from dart_jax.tokenization.tokenizer import encode_chat
    from serve_setup import QUESTIONS
    agent, base, _ = serve_setup
    prompts = [encode_chat(agent.tok, [{"role": "user", "content": INSTRUCTION + q}]) for q in QUESTIONS]
    shared = min(common_prefix(prompts[0], p) for p in prompts[1:])
    assert shared >= 48, shared
    settings = [(1.0, 11), (0.0, 0), (0.7, 5), (1.0, 3), (1.0, 11), (0.5, 9)]
    engine = Engine(agent, base, None, slots=3, segment=8, tool_workers=2, min_prefix=32)
    gens = [engine.submit(Request(tuple(prompts[k]), temperature=t, seed=s)) for k, (t, s) in enumerate(settings)]
    engine.run_until_idle(timeout=600)
    results = [g.result(timeout=1) for g in gens]
    assert engine.stats["prefixes"] == 1 and engine.stats["prefix_admitted"] >= 4, engine.stats
    (key,) = engine.prefixes
    assert len(key) == shared // PREFIX_STEP * PREFIX_STEP
    for k, r in enumerate(results):
        _same(r, _alone(agent, base, prompts[k], *settings[k]))
    # the learnt prefix's placement compiled for every row bucket writes nothing: two more requests as before
    engine.warmup_prefixes()
    more = [engine.submit(Request(tuple(prompts[k]), temperature=t, seed=s)) for k, (t, s) in enumerate(settings[:2])]
    engine.run_until_idle(timeout=600)
    for k, g in enumerate(more):
        assert g.result(timeout=1)["ids"] == results[k]["ids"]
    # the same prompt again (samples of one question) teaches no prefix of its own
    again = Engine(agent, base, None, slots=2, segment=8, min_prefix=32)
    for s in (1, 2):
        again.submit(Request(prompts[0], temperature=1.0, seed=s))  # a list: made a tuple
    again.run_until_idle(timeout=600)
    assert again.stats["prefixes"] == 0 and isinstance(next(iter(again.prefixes.recent)), tuple)
    off = Engine(agent, base, None, slots=3, segment=8, min_prefix=0)
    g = off.submit(Request(tuple(prompts[5]), temperature=0.5, seed=9))
    off.run_until_idle(timeout=600)
    assert off.stats["prefixes"] == 0 and g.result()["ids"] == results[5]["ids"]


def test_identical_prompts_admitted_together_are_prefilled_once_and_change_nothing(serve_setup):
    """A GRPO group's samples: one prompt, four seeds, admitted in one step -> one prefill of the prompt,
    placed in four rows; each row equals its request decoded alone. Off (share_identical=False): four prefills."""
    agent, base, prompts = serve_setup
    for share in (True, False):
        engine = Engine(agent, base, None, slots=4, segment=8, share_identical=share, min_prefix=0)
        gens = [engine.submit(Request(tuple(prompts[3]), temperature=1.0, seed=s)) for s in (1, 2, 3, 4)]
        engine.run_until_idle(timeout=600)
        assert engine.stats["group_prefills"] == (1 if share else 0), engine.stats
        assert engine.stats["group_admitted"] == (4 if share else 0), engine.stats
        assert engine.stats["prefill_rows"] == (0 if share else 4), engine.stats
        results = [g.result(timeout=1) for g in gens]
        assert len({tuple(r["ids"]) for r in results}) == 4
        for r, s in zip(results, (1, 2, 3, 4)):
            _same(r, _alone(agent, base, prompts[3], 1.0, s))


def test_identical_prompts_that_are_a_learnt_prefix_keep_every_row(serve_setup):
    """A learnt prefix K, then in one admission a prompt that starts with K and K itself twice (a group):
    all three share K's learnt state, none is lost, each equals its decode alone."""
    from dart_jax.tokenization.tokenizer import encode_chat
    from serve_setup import QUESTIONS
    agent, base, _ = serve_setup
    prompts = [encode_chat(agent.tok, [{"role": "user", "content": INSTRUCTION + q}]) for q in QUESTIONS]
    engine = Engine(agent, base, None, slots=3, segment=8, min_prefix=32, share_identical=True)
    for k in (0, 1):  # teach the prefix
        engine.submit(Request(tuple(prompts[k]), temperature=0.0))
    engine.run_until_idle(timeout=600)
    (key,) = engine.prefixes
    batch = [(prompts[2], 7), (list(key), 8), (list(key), 9)]
    gens = [engine.submit(Request(tuple(p), temperature=1.0, seed=s)) for p, s in batch]
    engine.run_until_idle(timeout=600)
    # K's rows take the learnt prefix's state (no prefill of their own); the prompt after it, its rest
    assert engine.stats["group_prefills"] == 0 and engine.stats["group_admitted"] == 2, engine.stats
    assert engine.stats["prefix_admitted"] == 2 and engine.stats["admitted"] == 5, engine.stats
    for g, (p, s) in zip(gens, batch):
        _same(g.result(timeout=1), _alone(agent, base, p, 1.0, s))


def test_an_append_of_every_row_in_any_order_equals_each_row_alone(serve_setup):
    """`_append` with every slot ready takes the in-place batch path with its rows longest first (here
    [1, 0]); the same observations appended one row at a time (gathered pieces of one) give the same
    routes, pending tokens and cache rows."""
    import jax
    agent, base, prompts = serve_setup
    obs = {0: agent.tok.encode(" Doc one.", add_special_tokens=False),
           1: agent.tok.encode(" A longer second observation, with more words in it.", add_special_tokens=False)}
    assert len(obs[1]) > len(obs[0])
    out = []
    for together in (True, False):
        engine = Engine(agent, base, None, slots=2, segment=8)
        for k in (0, 1):
            engine.submit(Request(tuple(prompts[k]), temperature=1.0, seed=k))
        engine._admit()
        routes = engine._append(obs) if together else {**engine._append({0: obs[0]}), **engine._append({1: obs[1]})}
        st = jax.device_get(engine.state)
        n = st.cache["index"]
        out.append((routes, st.pending.tolist(), st.next_pos.tolist(), n.tolist(),
                    [np.asarray(st.cache["k"][0])[i, :, :, :n[i]] for i in (0, 1)]))
    (r1, p1, q1, n1, k1), (r2, p2, q2, n2, k2) = out
    assert r1 == r2 and p1 == p2 and q1 == q2 and n1 == n2
    for a, b in zip(k1, k2):
        np.testing.assert_allclose(a, b, atol=1e-5)


def test_streamed_events_rebuild_the_response_and_the_queue_is_bounded(serve_setup):
    agent, base, prompts = serve_setup
    engine = Engine(agent, base, None, slots=2, segment=8, max_waiting=2).start()
    try:
        gen = engine.submit(Request(tuple(prompts[0]), temperature=1.0, seed=4))
        ids, kinds = [], []
        for ev in gen.stream(timeout=300):
            kinds.append(ev["kind"])
            if ev["kind"] in ("tokens", "observation"):
                ids += ev["ids"]
        traj = gen.result(timeout=1)
        assert ids == traj["ids"] and kinds[-1] == "done"
        assert traj["time_to_first_token_s"] <= traj["latency_s"]
    finally:
        engine.close()
    closed = Engine(agent, base, None, slots=1, segment=8, max_waiting=2)
    closed.submit(Request(tuple(prompts[0])))
    closed.submit(Request(tuple(prompts[1])))
    with pytest.raises(Overloaded):
        closed.submit(Request(tuple(prompts[2])))
    with pytest.raises(ValueError, match="top_p"):
        Request((1, 2), top_p=0.0)


def test_cancel_drops_a_waiting_request_at_once_and_tools_off_never_calls(serve_setup):
    agent, base, prompts = serve_setup
    engine = Engine(agent, base, None, slots=1, segment=8, max_waiting=2)
    first = engine.submit(Request(tuple(prompts[0]), temperature=1.0, seed=2, tools=False))
    waiting = engine.submit(Request(tuple(prompts[1])))
    engine.cancel(waiting)
    assert waiting.done() and waiting.finish == "cancelled" and engine.load()["waiting"] == 1  # the first
    engine.submit(Request(tuple(prompts[2])))  # its place in the queue is free again
    engine.run_until_idle(timeout=300)
    traj = first.result(timeout=1)
    # tools off: no call, no corrective message asking for one; every turn is the answer-only one
    assert traj["tool_calls"] == 0 and not traj["spans"] and traj["finish"] in ("answer", "budget", "length")
    engine.close()
