"""The GRPO stages alone (rl/stages.py): scoring hand-built trajectories, one update stage on a tiny
model, and the step's metrics — each checked against values computed by hand."""

import jax
import numpy as np
import pytest

from dart_jax.adapters.method import MethodSpec, init_adapters
from dart_jax.models.transformer import init_params
from dart_jax.rewards.training import QAReward
from dart_jax.rl import stages
from dart_jax.rl.optim import make_optimizer
from dart_jax.roles.router import RouterSpec
from dart_jax.rollout.trajectory import assemble
from dart_jax.run.spec import LossConfig, OptimConfig, UpdatePlan
from rl.test_masters import CFG32

OPEN, CLOSE = 60, 61
ROUTER = RouterSpec((OPEN,), (CLOSE,))


def _rollouts():
    """Four trajectories of two prompts (G = 2): texts with and without the right answer."""
    resp = lambda ids, routes=None: {"ids": ids, "mask": [1] * len(ids), "logprobs": [-1.0] * len(ids),  # noqa: E731
                                     "routes": routes or [0] * len(ids)}
    texts = ["<answer> Paris </answer>", "<answer> Lyon </answer>", "<answer> Tolstoy </answer>", "no answer"]
    tb = assemble([[5, 6]] * 4, [[0, 0]] * 4, [resp([7, OPEN, 8, CLOSE, 9], [0, 1, 1, 0, 0]), resp([7, 9]),
                                               resp([10, 11]), resp([12])],
                  ["q1", "q1", "q2", "q2"], ["answer", "answer", "answer", "length"], [[]] * 4, texts)
    rows = [{"id": "q1", "question": "capital of france?", "golden_answers": ["Paris"], "data_source": "a"}] * 2 + \
           [{"id": "q2", "question": "who wrote war and peace?", "golden_answers": ["Leo Tolstoy"],
             "data_source": "b"}] * 2
    metas = [{"golden_answers": r["golden_answers"], "data_source": r["data_source"]} for r in rows]
    return stages.Rollouts(tb, rows, metas)


def test_score_stage_rewards_accuracy_and_advantages():
    ro = _rollouts()
    sc = stages.score(ro, QAReward(), MethodSpec("dart"), ROUTER, pad_multiple=8)
    np.testing.assert_array_equal(sc.scores, [1, 0, 0, 0])  # "Tolstoy" is not "Leo Tolstoy" after normalisation
    np.testing.assert_array_equal(sc.accuracy, [1, 0, 0, 0])
    # group q1: scores (1, 0), mean 0.5, unbiased std 0.7071 -> ±0.7071; group q2 all equal -> 0
    np.testing.assert_allclose(sc.batch["advantages"], [0.5 / (0.5 ** 0.5 + 1e-6), -0.5 / (0.5 ** 0.5 + 1e-6), 0, 0],
                               rtol=1e-6)
    assert sc.batch["tokens"].shape == (4, 8) and sc.valid.all()
    # the <search>-like span in row 0 routes to the tool adapter (position of OPEN .. before CLOSE)
    np.testing.assert_array_equal(sc.batch["route_ids"][0, :7], [0, 0, 0, 1, 1, 0, 0])


def test_update_stage_walks_mini_batches_and_moves_the_state():
    base = init_params(CFG32, jax.random.PRNGKey(0))
    method = MethodSpec("dart", rank=4, alpha=8.0)
    ads = jax.tree.map(lambda x: x + 0.05, init_adapters(method, CFG32, jax.random.PRNGKey(1)))
    ro = _rollouts()
    sc = stages.score(ro, QAReward(), method, ROUTER, pad_multiple=8)
    oc, lc = OptimConfig(lr=1e-2, warmup_steps=0), LossConfig(kl_coef=0.0)
    plan = UpdatePlan(mini_batch=2, micro_batch=1, ppo_epochs=2, seed=3)
    mesh = jax.make_mesh((1, 1, 1), ("data", "fsdp", "tensor"), devices=jax.devices()[:1],
                         axis_types=(jax.sharding.AxisType.Auto,) * 3)
    from dart_jax.rl.placement import place_state
    state, base = place_state(method, CFG32, base, ads, make_optimizer(oc), mesh)
    up = stages.Updater(CFG32, method, lc, oc, plan, mesh)
    sc.batch["old_logp"], sc.batch["ref_logp"] = up.logprobs(state, base, sc.batch)
    assert np.array_equal(sc.batch["old_logp"], sc.batch["ref_logp"])  # no KL: the reference is not computed
    start = jax.device_get(state.params)
    state, upd = up(state, base, sc.batch, 0, jax.random.PRNGKey(0))
    assert len(upd) == 4 and int(state.step) == 4  # 2 epochs × 2 mini-batches
    assert all(float(u["lr"]) == pytest.approx(1e-2) for u in upd)
    moved = max(float(np.abs(np.asarray(a) - np.asarray(b)).max())
                for a, b in zip(jax.tree.leaves(state.params), jax.tree.leaves(start)))
    assert moved > 0
    with pytest.raises(ValueError, match="old_logp"):
        UpdatePlan(2, 1, old_logp="cached")


def test_step_metrics_by_hand():
    ro = _rollouts()
    sc = stages.score(ro, QAReward(), MethodSpec("dart"), ROUTER, pad_multiple=8)
    sc.valid[2:] = False  # pretend q2's reference failed: it leaves the means and is counted
    upd = [{"loss": 1.0, "pg_loss": 0.5, "kl": 0.0, "entropy": 2.0, "pg_clipfrac": 0.1, "pg_clipfrac_lower": 0.0,
            "ppo_kl": 0.0, "grad_norm": 3.0, "skipped": 0.0, "lr": 1e-3}]
    m = stages.step_metrics(ro, sc, upd, "qa", with_kl=False, gap=False, times={"rollout": 1.0, "score": 0.5,
                                                                                  "update": 2.5})
    assert m["reward/mean"] == 0.5 and m["reward/dropped_prompts"] == 1.0 and m["reward/a"] == 0.5
    assert np.isnan(m["reward/b"]) and m["protocol/answer_rate"] == 0.75 and m["protocol/finish_length"] == 0.25
    assert m["time/step_s"] == 4.0 and m["actor/lr"] == 1e-3 and "actor/kl" not in m
    # GRPO's signal: q1's two samples scored 1 and 0 (mixed); q2 left the update, so it is no group
    assert m["advantage/groups"] == 1.0 and m["advantage/mixed_groups"] == 1.0
