"""Rollouts on the continuous-batching engine (dart_jax/serve/rollouts.py, `rollout.engine=continuous`): each
row draws what it draws in its batch of the batch-synchronous sampler, so a set of rollouts — rows
refilled as others finish, tool calls off the decode step — equals the batches row for row; a GRPO
step's batch (groups of one prompt, a process's row offset) equals the batch sampler's TrajectoryBatch;
and an evaluation on the engine writes the records the batch evaluation writes, in item order.

The tiny random Llama of tests/serve_setup.py (tool tags are frequent tokens, so random text pauses
for the real lexical retriever over lab world 1). Tolerances: ids, routes, masks, finish, turns and
texts exact; log-probs 2e-5 (a batch of 4 rows and the engine's 3 round their matmuls differently)."""

import dataclasses
import json

import numpy as np
import pytest

from dart_jax.adapters.method import TwoModels
from dart_jax.eval.datasets import resolve
from dart_jax.eval.runner import EvalOptions, Evaluator
from dart_jax.rollout.agent import Agent, RolloutConfig
from dart_jax.rollout.sampling import SamplingConfig
from dart_jax.serve.rollouts import check_engine, continuous_rollouts, engine_batch
from serve_setup import RC


def _row(tb, i: int) -> dict:
    n = int(tb.length[i])
    return {"ids": tb.ids[i, :n].tolist(), "routes": tb.route_ids[i, :n].tolist(), "mask": tb.loss_mask[i, :n].tolist(),
            "positions": tb.positions[i, :n].tolist(), "logprobs": tb.sampler_logprobs[i, :n],
            "finish": tb.finish_reason[i], "turns": tb.turns[i], "texts": (tb.response_text[i], tb.reward_text[i]),
            "observed": tb.observed[i], "prompt_len": int(tb.prompt_len[i]), "uid": tb.uids[i]}


# slow (41 s alone): the default run checks the engine against the batch loop on a GRPO batch
# (test_a_grpo_batch_on_the_engine_is_the_batch_samplers) and on evaluations (below)
@pytest.mark.slow
def test_continuous_rollouts_equal_the_batches_row_for_row(serve_setup):
    agent, base, prompts = serve_setup
    # two batches (seeds 7 and 8) of the batch sampler at T = 1
    batches = [(7, list(range(4))), (8, [4, 5])]
    want = {}
    for seed, rows in batches:
        tb = agent.rollout(base, None, [prompts[k] for k in rows], [f"u{k}" for k in rows], seed=seed)
        want.update({k: _row(tb, j) for j, k in enumerate(rows)})
    draws = [(seed, j) for seed, rows in batches for j, _ in enumerate(rows)]
    got = {}
    order = []
    for i, tb in continuous_rollouts(agent, base, None, prompts, [f"u{k}" for k in range(6)], [{}] * 6, draws,
                                     slots=3):
        assert tb.batch_size == 1 and i not in got
        got[i] = _row(tb, 0)
        order.append(i)
    assert sorted(got) == list(range(6))
    assert sum(len(w["turns"]) for w in want.values()) > 6  # rows paused for the tool
    for k in range(6):
        g, w = got[k], want[k]
        np.testing.assert_allclose(g.pop("logprobs"), w.pop("logprobs"), atol=2e-5, err_msg=str(k))
        assert g == w, k


def test_a_grpo_batch_on_the_engine_is_the_batch_samplers(serve_setup):
    """engine_batch (GRPO's rollouts with rollout.train_engine=continuous): groups of three
    samples of two prompts, rows 6-11 of a step's batch at T = 1, each group's prompt prefilled once."""
    agent, base, prompts = serve_setup
    ps, uids = [prompts[0]] * 3 + [prompts[2]] * 3, ["a"] * 3 + ["b"] * 3
    metas = [{"k": i} for i in range(6)]
    agent.take_phases()  # the session's earlier rollouts
    want = agent.rollout(base, None, ps, uids, metas, seed=5, row_offset=6)
    phases = agent.take_phases()
    on = Agent(agent.spec.model, agent.tok, agent.protocol, agent.tool, SamplingConfig(temperature=1.0),
               dataclasses.replace(RC, engine_segment=8))
    got = engine_batch(on, base, None, ps, uids, metas, seed=5, row_offset=6)
    assert got.ids.shape == want.ids.shape and got.batch_size == 6
    assert sum(len(t) for t in want.turns) > 6 and len(set(map(len, want.turns))) > 1  # rows paused, unevenly
    assert len({tuple(want.ids[i]) for i in range(3)}) == 3  # a group's samples differ
    for i in range(6):
        g, w = _row(got, i), _row(want, i)
        np.testing.assert_allclose(g.pop("logprobs"), w.pop("logprobs"), atol=2e-5, err_msg=str(i))
        assert g == w, i
    for k in ("ids", "positions", "loss_mask", "route_ids"):  # the padding too
        np.testing.assert_array_equal(getattr(got, k), getattr(want, k), err_msg=k)
    # the batch loop's account (Agent.take_phases), from its trajectories: a segment per turn, each as long
    # as the turn's longest row, every row still running in it; the engine's phase seconds beside
    turns = want.turns
    n_seg = max(map(len, turns))
    longest = [max(t[k]["tokens"] for t in turns if len(t) > k) for k in range(n_seg)]
    row_steps = sum(m * sum(len(t) > k for t in turns) for k, m in enumerate(longest))
    assert phases["segments"] == n_seg and phases["decode_steps"] == sum(longest)
    assert phases["decode_fill"] == pytest.approx(want.loss_mask.sum() / row_steps)
    assert phases["appends"] >= 1 and phases["tool_s"] > 0 and phases["append_s"] > 0
    engine = on.take_phases()
    assert engine["decode_s"] > 0 and engine["admit_s"] > 0 and "segments" not in engine


def test_the_engine_refuses_what_it_cannot_run(serve_setup):
    agent, _, _ = serve_setup
    with pytest.raises(ValueError, match="two-model composition"):
        check_engine(agent, composition=("reasoning", "tool"))
    with pytest.raises(ValueError, match="two-model composition"):  # a 2-Agent policy
        check_engine(agent, base=TwoModels(reasoning={}, tool={}))
    with pytest.raises(ValueError, match="2 processes"):
        check_engine(agent, processes=2)
    with pytest.raises(ValueError, match="rollout.engine='fast'"):
        RolloutConfig(engine="fast")
    with pytest.raises(ValueError, match="rollout.train_engine='fast'"):
        RolloutConfig(train_engine="fast")
    with pytest.raises(ValueError, match="rollout.train_engine=continuous: 2 processes.*rollout.train_engine=batch"):
        check_engine(agent, processes=2, setting="rollout.train_engine")


@pytest.mark.parametrize("temperature,n", [(0.0, 1), (1.0, 2)])
def test_evaluation_on_the_engine_writes_the_batch_records(serve_setup, tmp_path, temperature, n):
    agent, base, _ = serve_setup
    (lab,) = resolve(["lab_world1"], "qa")
    out = {}
    for engine in ("batch", "continuous"):
        rc = dataclasses.replace(RC, engine=engine, engine_segment=8)
        options = EvalOptions(n_samples=n, temperature=temperature, batch=3, limit=4, seed=5, progress=False)
        ev = Evaluator(agent.spec.model, agent.tok, agent.protocol, None, rc, "dart_jax", options,
                       set_tools={lab.name: agent.tool})
        path = tmp_path / f"{engine}.jsonl"
        res = ev.run([lab], base, None, str(path))
        out[engine] = (res, [json.loads(line) for line in open(path)])
    (res_b, recs_b), (res_c, recs_c) = out["batch"], out["continuous"]
    assert len(recs_b) == len(recs_c) == 4 * n
    assert [(r["id"], r["sample"]) for r in recs_c] == [(r["id"], r["sample"]) for r in recs_b]  # item order
    assert all(r["turns"] > 1 for r in recs_b)  # every row paused (a tool call or a corrective message)
    assert recs_c == recs_b
    # the same results but where the time went (seconds, the loop's or the engine's phases)
    same = lambda r: json.dumps({k: v for k, v in r[lab.name].items() if k not in ("seconds", "phases")},  # noqa: E731
                                sort_keys=True)
    assert same(res_c) == same(res_b)  # (json: the lab's NaN rates compare equal)
    assert res_b[lab.name]["phases"]["segments"] >= 1 and res_c[lab.name]["phases"]["admit_s"] > 0


def test_a_low_memory_map_limit_falls_back_to_the_batch_loop_with_a_warning(tmp_path, caplog):
    """XLA:CPU holds ~47 memory maps per layer per compiled program: the default limit (65,530) holds ~46
    programs of a 30-layer model, fewer than an engine compiles, so the engine is not used (the same
    trajectories, batch-synchronously), warned once, naming the fix."""
    import dart_jax.serve.rollouts as serve_rollouts
    limit = tmp_path / "max_map_count"
    limit.write_text("65530\n")
    assert serve_rollouts.map_count_holds(30, str(limit)) == (65530, 46)
    serve_rollouts._WARNED.discard("rollout.engine")
    with caplog.at_level("WARNING"):
        assert not serve_rollouts.engine_fits(30, "rollout.engine", str(limit))
        assert not serve_rollouts.engine_fits(30, "rollout.engine", str(limit))
    assert caplog.text.count("vm.max_map_count = 65530") == 1 and "sysctl -w vm.max_map_count=1048576" in caplog.text
    caplog.clear()
    limit.write_text("1048576\n")
    assert serve_rollouts.engine_fits(30, "rollout.engine", str(limit)) and not caplog.text
    assert serve_rollouts.engine_fits(30, "rollout.engine", str(tmp_path / "absent"))  # unreadable: not refused
    assert serve_rollouts.engine_fits(2, "rollout.engine", str(tmp_path / "absent"))


@pytest.mark.parametrize("train_engine", ["batch", "continuous"])
def test_grpo_rollouts_follow_train_engine_not_engine(serve_setup, monkeypatch, train_engine):
    """rl.stages.rollout (the trainer's, and the gradient samplers') decodes as rollout.train_engine says,
    whatever rollout.engine (evaluation's) says. The dispatch only: the engine's batch is recorded and
    decoded by the batch loop (that the two are equal is test_a_grpo_batch_on_the_engine_is_the_batch_samplers)."""
    import dart_jax.serve.rollouts as serve_rollouts
    from dart_jax.rl.stages import rollout
    from dart_jax.rollout.compose import rollout_policy
    agent, base, _ = serve_setup
    other = "continuous" if train_engine == "batch" else "batch"
    a = Agent(agent.spec.model, agent.tok, agent.protocol, agent.tool, SamplingConfig(temperature=1.0),
              dataclasses.replace(RC, engine=other, train_engine=train_engine, engine_segment=8))
    called = []
    monkeypatch.setattr(serve_rollouts, "engine_batch",
                        lambda *args, **kw: called.append(kw) or rollout_policy(*args, **kw))
    rows = [{"id": "q0", "question": "Who founded the Pomorn Brothers?", "golden_answers": ["x"]}]
    ro = rollout(a, (base, None), rows, 2, seed=3)
    assert ro.tb.batch_size == 2 and len(called) == (train_engine == "continuous")
    assert all(kw == {"seed": 3, "row_offset": 0} for kw in called)
