"""launch.evaluate end to end: greedy is really greedy, n-samples mode, the policy sources (orbax
checkpoint, exported adapters, warm start, removed adapter), fixed retrieval on the real SmolLM2 with
the shipped warm start, and the CLI on real Spider databases."""

import json
import os
import subprocess
import sys

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from configs import evaluate as eval_config, quickstart
from dart_jax.eval.job import evaluate
from dart_jax.eval.policy import load_eval_policy
from dart_jax.eval.runner import EvalOptions
from dart_jax.models.transformer import forward
from dart_jax.rl.trainer import Trainer
from dart_jax.rollout.agent import Agent, RolloutConfig
from dart_jax.rollout.protocol import QA
from dart_jax.rollout.sampling import SamplingConfig
from dart_jax.rollout.tasks import qa_rows, qa_task
from dart_jax.run.policy import run_mesh
from dart_jax.run.spec import run_spec
from dart_jax.run.task import build_tool
from xla_env import xla_flags

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def _small(c, model_dir):
    c.model.path = model_dir
    c.retriever.topk = 1
    c.rollout.max_turns = 1
    c.rollout.max_tokens_per_turn = 12
    c.rollout.max_obs_tokens = 64
    c.rollout.max_response_tokens = 128
    c.mesh.shape = (1, 1, 1)
    return c


def _records(out):
    return [json.loads(line) for line in open(os.path.join(out, "per_question.jsonl"))]


def test_greedy_is_argmax_at_every_step_and_ignores_the_seed(tiny_smollm_dir, tmp_path):
    c = _small(eval_config.get_config("qa"), tiny_smollm_dir)
    a = evaluate(c, str(tmp_path / "a"), ["nq"], EvalOptions(limit=3, batch=3, seed=0, progress=False))
    b = evaluate(c, str(tmp_path / "b"), ["nq"], EvalOptions(limit=3, batch=2, seed=123, progress=False))
    assert [r["response"] for r in _records(tmp_path / "a")] == [r["response"] for r in _records(tmp_path / "b")]
    assert a["datasets"]["nq"]["questions"] == 3 and a["setup"]["temperature"] == 0.0 and b["setup"]["seed"] == 123
    # every generated token is the argmax of the teacher-forced logits before it
    policy = load_eval_policy(run_spec(c), run_mesh(run_spec(c)))
    agent = Agent(policy.cfg, policy.tokenizer, QA, build_tool(run_spec(c), QA), SamplingConfig(temperature=0.0),
                  RolloutConfig(max_turns=1, max_tokens_per_turn=12, max_obs_tokens=64, max_response_tokens=128,
                                invalid_action="search_r1", route_mode="none"))
    rows = qa_rows(n=3)
    prompts, uids, metas = qa_task(policy.tokenizer, rows)
    tb = agent.rollout(policy.base, None, prompts, uids, metas, seed=5)
    checked = 0
    for i in range(tb.batch_size):
        n = int(tb.length[i])
        logits, _ = forward(policy.base, None, jnp.asarray(tb.ids[i:i + 1, :n]), jnp.asarray(tb.positions[i:i + 1, :n]),
                            None, None, cfg=policy.cfg)
        z = np.asarray(logits[0], np.float32)
        for t in np.nonzero(tb.loss_mask[i, :n])[0]:
            top2 = np.sort(z[t - 1])[-2:]
            if top2[1] - top2[0] > 1e-4:  # a near-tie may flip between the cached and the full forward
                assert tb.ids[i, t] == int(np.argmax(z[t - 1]))
                checked += 1
    assert checked > 20


def test_n_samples_records_per_question_accuracy(tiny_smollm_dir, tmp_path):
    c = _small(eval_config.get_config("qa"), tiny_smollm_dir)
    with pytest.raises(ValueError, match="greedy samples are identical"):
        EvalOptions(n_samples=3, temperature=0.0)
    res = evaluate(c, str(tmp_path), ["bamboogle"], EvalOptions(n_samples=3, temperature=1.0, limit=2, batch=6,
                                                                 progress=False))
    recs = _records(tmp_path)
    assert len(recs) == 6 and sorted({r["sample"] for r in recs}) == [0, 1, 2]
    assert len({r["response"] for r in recs}) > 2  # sampled, not greedy
    acc = [json.loads(line) for line in open(res["files"]["per_question_accuracy"])]
    assert [a["n"] for a in acc] == [3, 3]
    for a in acc:
        assert a["accuracy"] == pytest.approx(np.mean([r["score"] for r in recs if r["id"] == a["id"]]))
    d = res["datasets"]["bamboogle"]
    assert d["trajectories"] == 6 and "pass_at_n" in d and "retrieval_acc" in d


def _train_one_step(model_dir, out):
    c = quickstart.get_config()
    _small(c, model_dir)
    c.warm_start = ""
    c.train.steps, c.train.prompts_per_step, c.train.group_size = 1, 2, 2
    c.train.mini_batch, c.train.micro_batch = 4, 2
    c.train.old_logp = "recompute"
    c.loss.entropy_coef, c.optim.lr = 0.01, 1e-2  # random model: the entropy term moves the adapters
    c.eval.n = 0
    c.output.dir = str(out)
    c.output.progress, c.output.tensorboard, c.output.save_rollouts = False, False, False
    Trainer(c).run()
    return c


@pytest.mark.slow  # CI budget: kept out of the default run (python -m pytest -m slow)
def test_orbax_checkpoint_and_exported_adapters_evaluate_identically(tiny_smollm_dir, tmp_path):
    c = _train_one_step(tiny_smollm_dir, tmp_path / "run")
    opts = EvalOptions(limit=3, batch=3, progress=False)
    via_orbax = evaluate(c, str(tmp_path / "e1"), ["nq"], opts, checkpoint=str(tmp_path / "run" / "checkpoints"))
    via_export = evaluate(c, str(tmp_path / "e2"), ["nq"], opts, checkpoint=str(tmp_path / "run"))
    assert via_orbax["setup"]["step"] == 1 and via_orbax["setup"]["variant"] == "dart"
    assert via_export["setup"]["adapters"].endswith("adapters")
    assert [r["response"] for r in _records(tmp_path / "e1")] == [r["response"] for r in _records(tmp_path / "e2")]
    # the wiring of launch.evaluate --compose-*: a two-model composition (rollout.compose) of the run's
    # policy with itself is the run's policy (this greedy tiny model seldom writes a tag, so hand-offs
    # themselves are tested in tests/rollout/test_compose.py)
    same = evaluate(c, str(tmp_path / "e3"), ["nq"], opts, checkpoint=str(tmp_path / "run"),
                    compose=("tool", str(tmp_path / "run")))
    assert [r["response"] for r in _records(tmp_path / "e3")] == [r["response"] for r in _records(tmp_path / "e2")]
    assert same["setup"]["composition"]["role"] == "tool"
    # H_Tool's shape: the bare model writes outside the tool spans, the run's policy inside them
    h_tool = evaluate(c, str(tmp_path / "e4"), ["nq"], opts, compose=("tool", str(tmp_path / "run")))
    assert h_tool["setup"]["policy"].startswith(f"tool by {tmp_path / 'run'}, reasoning by ")
    with pytest.raises(ValueError, match="compose role"):
        evaluate(c, str(tmp_path / "e5"), ["nq"], opts, compose=("answer", str(tmp_path / "run")))
    # DART-Reas: the tool adapter removed at inference (B = 0), the reasoning adapter untouched
    mesh = run_mesh(run_spec(c))
    full = load_eval_policy(run_spec(c), mesh, checkpoint=str(tmp_path / "run"))
    reas = load_eval_policy(run_spec(c), mesh, checkpoint=str(tmp_path / "run"), remove="tool")
    assert all(float(jnp.abs(ab["b"]).max()) > 0 for ab in full.adapters["tool"].params.values())
    assert all(float(jnp.abs(ab["b"]).max()) == 0 for ab in reas.adapters["tool"].params.values())
    jax.tree.map(np.testing.assert_array_equal, full.adapters["reasoning"].params, reas.adapters["reasoning"].params)
    with pytest.raises(FileNotFoundError, match="neither a DART adapter directory"):
        load_eval_policy(run_spec(c), mesh, checkpoint=str(tmp_path))
    with pytest.raises(FileNotFoundError, match="no checkpoint for step 7"):
        load_eval_policy(run_spec(c), mesh, checkpoint=str(tmp_path / "run"), step=7)


@pytest.mark.slow  # CI budget: kept out of the default run (python -m pytest -m slow)
def test_fixed_retrieval_replays_a_run_on_smollm2_with_the_warm_start(tmp_path):
    """The shipped warm start calls the retriever on every question; replaying its own documents
    reproduces its greedy run exactly, and replaying other documents changes only what it reads."""
    c = quickstart.get_config()
    c.eval.n = 0
    opts = EvalOptions(limit=4, batch=4, progress=False)
    live = evaluate(c, str(tmp_path / "live"), ["nq"], opts, checkpoint=quickstart.WARM_START)
    assert live["setup"]["variant"] == "warm_start"
    recs = _records(tmp_path / "live")
    assert all(r["tool_calls"] for r in recs)
    replay = evaluate(c, str(tmp_path / "replay"), ["nq"], opts, checkpoint=quickstart.WARM_START,
                      fixed_retrieval=str(tmp_path / "live" / "per_question.jsonl"))
    assert [r["response"] for r in _records(tmp_path / "replay")] == [r["response"] for r in recs]
    assert replay["fixed_retrieval_stats"]["replayed"] == sum(len(r["tool_calls"]) for r in recs)
    assert replay["datasets"]["nq"]["score"] == live["datasets"]["nq"]["score"]
    other = tmp_path / "other.jsonl"
    with open(other, "w") as f:
        for r in recs:
            calls = [dict(t, observation="Doc 1(Title: Nothing) There is nothing here.\n") for t in r["tool_calls"]]
            f.write(json.dumps(dict(r, tool_calls=calls)) + "\n")
    evaluate(c, str(tmp_path / "other"), ["nq"], opts, checkpoint=quickstart.WARM_START, fixed_retrieval=str(other))
    for r in _records(tmp_path / "other"):
        assert r["tool_calls"] and all(t["observation"].startswith("Doc 1(Title: Nothing)") for t in r["tool_calls"])
        assert r["retrieval_hit"] is False


def test_cli_sql_on_real_spider_databases(tiny_smollm_dir, tmp_path):
    out = tmp_path / "sql"
    cmd = [sys.executable, "-m", "launch.evaluate", "--config=configs/evaluate.py:sql",
           f"--config.model.path={tiny_smollm_dir}", "--config.rollout.max_turns=1",
           "--config.rollout.max_tokens_per_turn=8", "--config.rollout.max_response_tokens=64",
           "--dataset", "spider_dev,spider_dk", "--limit", "3", "--batch", "3", "--out", str(out), "--quiet"]
    env = dict(os.environ, XLA_FLAGS=xla_flags(1))
    p = subprocess.run(cmd, cwd=REPO, capture_output=True, text=True, env=env, timeout=600)
    assert p.returncode == 0, p.stderr[-3000:]
    assert "| EX | Spider-dev | Spider-DK | Avg (these sets) |" in p.stdout
    res = json.load(open(out / "results.json"))
    assert res["datasets"]["spider_dev"]["questions"] == 3 and res["datasets"]["spider_dk"]["semantics"] == "spider"
    recs = _records(out)
    assert len(recs) == 6 and all(r["db_id"] and r["gold_sql"] for r in recs)
    assert all(r["score"] == 0.0 and r["error"] == "no <solution>" for r in recs if r["solution"] is None)
    assert os.path.isfile(out / "results.csv") and os.path.isfile(out / "results.md")


def test_peft_adapters_apply_to_every_generated_token(tiny_smollm_dir, tmp_path):
    from dart_jax.adapters.method import MethodSpec, init_adapters
    from dart_jax.checkpoints.peft_io import export_peft
    c = _small(eval_config.get_config("qa"), tiny_smollm_dir)
    base_policy = load_eval_policy(run_spec(c), run_mesh(run_spec(c)))
    ad = init_adapters(MethodSpec("lora", rank=4, alpha=8.0), base_policy.cfg, jax.random.PRNGKey(1))["shared"]
    ad = ad.replace(params={t: {"a": ab["a"], "b": 0.5 * jax.random.normal(jax.random.PRNGKey(2), ab["b"].shape)}
                            for t, ab in ad.params.items()})
    export_peft(ad, base_policy.cfg, str(tmp_path / "peft"))
    opts = EvalOptions(limit=2, batch=2, progress=False)
    plain = evaluate(c, str(tmp_path / "plain"), ["nq"], opts)
    res = evaluate(c, str(tmp_path / "peft_eval"), ["nq"], opts, peft=str(tmp_path / "peft"))
    assert res["setup"]["variant"] == "lora" and plain["setup"]["variant"] == "base"
    responses = [r["response"] for r in _records(tmp_path / "peft_eval")]
    assert [r["response"] for r in _records(tmp_path / "plain")] != responses
    with pytest.raises(ValueError, match="--checkpoint or --peft, not both"):
        load_eval_policy(run_spec(c), run_mesh(run_spec(c)), checkpoint="x", peft="y")
