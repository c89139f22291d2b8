"""The trainer end to end on a tiny random Llama that uses SmolLM2's real tokenizer (so prompts,
tags, the real retriever and EM rewards are the quickstart's): a run interrupted mid-way and
resumed ends with the same parameters as an uninterrupted run; checkpoints hold no base weights;
a corrupt newest checkpoint falls back to the previous one."""

import json
import os

import jax
import numpy as np
import pytest

from configs import quickstart
from dart_jax.rl.trainer import DataStream, Trainer
from dart_jax.run.checkpoint import Checkpointer
from dart_jax.run.metrics import read_metrics
from xla_env import xla_flags


def _config(model_dir, out_dir, steps=3):
    c = quickstart.get_config()
    c.model.path = model_dir
    c.warm_start = ""  # the shipped warm start belongs to SmolLM2, not to this tiny model
    c.train.old_logp = "recompute"
    c.loss.kl_coef = 0.001
    c.eval.n = 2  # held-out greedy rollouts before the first and after the last step
    c.train.steps = steps
    c.train.prompts_per_step = 2
    c.train.group_size = 2
    c.train.mini_batch = 2
    c.train.micro_batch = 1
    c.rollout.max_turns = 1
    c.rollout.max_tokens_per_turn = 16
    c.rollout.max_obs_tokens = 64
    c.rollout.max_response_tokens = 128
    c.rollout.invalid_action = "search_r1"
    c.loss.entropy_coef = 0.01  # random model: rewards are 0, the entropy term moves the adapters
    c.optim.lr = 1e-2
    c.output.dir = str(out_dir)
    c.output.checkpoint_every = 1
    c.output.keep = 5
    c.output.progress = False
    c.output.tensorboard = False
    c.output.export_adapters = False
    c.mesh.shape = (2, 1, 1)  # sharded over two of the forced host devices
    return c


class Crash(RuntimeError):
    pass


def _leaves(state):
    return [np.asarray(x) for x in jax.tree.leaves(state.params)]


def test_resume_matches_uninterrupted_run(tiny_smollm_dir, tmp_path):
    full = Trainer(_config(tiny_smollm_dir, tmp_path / "full"))
    init = _leaves(full.state)
    out = full.run()
    final = _leaves(full.state)
    assert any(not np.allclose(a, b) for a, b in zip(init, final)), "training did not move the adapters"

    def crash(step, metrics):
        if step == 2:
            raise Crash("killed after step 2's update, before its checkpoint")

    with pytest.raises(Crash):
        Trainer(_config(tiny_smollm_dir, tmp_path / "resumed"), on_step=crash).run()
    assert Checkpointer(str(tmp_path / "resumed" / "checkpoints")).steps() == [1]
    again = Trainer(_config(tiny_smollm_dir, tmp_path / "resumed"))
    again.run(resume=True)
    for a, b in zip(final, _leaves(again.state)):
        np.testing.assert_array_equal(a, b)
    steps = [r["step"] for r in read_metrics(str(tmp_path / "resumed" / "metrics.jsonl"))]
    assert steps == [0, 1, 2, 3]  # step 0: the held-out evaluation of the starting policy
    # which code and machine wrote each (re)start: the crashed start at 0, the resume at checkpoint 1
    from dart_jax.run import provenance
    prov = provenance.read(str(tmp_path / "resumed"))
    assert [(p["start_step"], p["resumed"]) for p in prov] == [(0, False), (1, True)]
    assert prov[0]["versions"]["jax"] == jax.__version__ and prov[0]["machine"]["devices"] >= 1
    assert prov[0]["commit"] is None or len(prov[0]["commit"]) == 40
    evals = [r for r in read_metrics(str(tmp_path / "resumed" / "metrics.jsonl")) if "eval/reward" in r]
    assert [r["step"] for r in evals] == [0, 3] and evals[0]["eval/n"] == 2
    # saved trajectories (self-distillation input): 4 per step, none duplicated by the crash + resume,
    # and identical to the uninterrupted run's
    saved = [json.loads(line) for line in open(tmp_path / "resumed" / "rollouts.jsonl")]
    assert [r["step"] for r in saved] == [1] * 4 + [2] * 4 + [3] * 4
    assert saved == [json.loads(line) for line in open(tmp_path / "full" / "rollouts.jsonl")]
    assert all(r["pieces"] and r["question"] and r["golden_answers"] for r in saved)
    full_rows = read_metrics(out["metrics"])
    res_rows = read_metrics(str(tmp_path / "resumed" / "metrics.jsonl"))
    assert [r.get("reward/mean") for r in full_rows] == [r.get("reward/mean") for r in res_rows]
    assert os.path.isfile(out["plot"])
    # the checkpoint holds the trainable tree, the optimiser state, step and RNG — never the base
    ckpt = Checkpointer(out["checkpoints"])
    _, tree, meta = ckpt.restore_latest(full._train_tree())
    names = " ".join(json.dumps(k) for k in _flat_names(tree))
    assert "embed" not in names and meta["data_position"] == 3 * 2


def _flat_names(tree):
    from dart_jax.run.checkpoint import flatten_state
    return list(flatten_state(tree))


def test_corrupt_newest_checkpoint_falls_back(tmp_path):
    ck = Checkpointer(str(tmp_path / "ck"), keep=3)
    like = {"w": np.zeros((4, 3), np.float32), "step": np.zeros((), np.int32)}
    ck.save(1, {"w": np.ones((4, 3), np.float32), "step": np.asarray(1, np.int32)}, {"data_position": 10})
    ck.save(2, {"w": 2 * np.ones((4, 3), np.float32), "step": np.asarray(2, np.int32)}, {"data_position": 20})
    step, tree, meta = ck.restore_latest(like)
    assert step == 2 and meta["data_position"] == 20
    # flip bytes in the newest checkpoint's largest data file
    files = [os.path.join(r, f) for r, _, fs in os.walk(tmp_path / "ck" / "2") for f in fs]
    victim = max(files, key=os.path.getsize)
    with open(victim, "r+b") as f:
        data = bytearray(f.read())
        data[len(data) // 2] ^= 0xFF
        f.seek(0)
        f.write(data)
    step, tree, meta = ck.restore_latest(like)
    assert step == 1 and meta["data_position"] == 10
    np.testing.assert_array_equal(np.asarray(tree["w"]), np.ones((4, 3)))
    # an unfinished save (no manifest) is skipped too
    os.remove(tmp_path / "ck" / "integrity" / "1.json")
    assert ck.restore_latest(like) is None


def test_data_stream_is_resumable():
    a = DataStream(5, seed=3)
    first = a.take(7)
    b = DataStream(5, seed=3, position=4)
    assert a.take(6) == DataStream(5, seed=3, position=7).take(6)
    assert b.take(3) == first[4:7]
    assert sorted(first[:5]) == list(range(5))  # an epoch is a permutation


@pytest.mark.slow  # CI budget: kept out of the default run (python -m pytest -m slow)
def test_sql_task_trains_on_real_spider_databases(tiny_smollm_dir, tmp_path):
    c = _config(tiny_smollm_dir, tmp_path / "sql", steps=1)
    c.task = "sql"
    c.data.train = [dict(reader="spider", path="data/spider/dev_questions.jsonl", db_root="data/spider/database",
                         data_source="spider_dev", limit=8)]
    c.eval.data = [dict(c.data.train[0], offset=8, limit=2)]  # held-out SQL rollouts on the real databases
    c.method.variant = "lora"
    c.method.rank, c.method.alpha = 4, 8.0
    c.output.export_adapters = True  # no-op for lora: only DART exports an adapter directory
    tr = Trainer(c)
    out = tr.run()
    before, row = read_metrics(out["metrics"])[:2]
    assert before["step"] == 0 and before["eval/n"] == 2 and before["eval/reward"] == -1.0
    # the random model writes no <solution>: SkyRL's format check gives -1 to every trajectory
    assert row["reward/mean"] == -1.0 and row["reward/spider_dev"] == -1.0
    assert row["advantage/abs_mean"] == 0.0
    assert "adapters" not in out
    # where the rollout's time went (Agent.take_phases): parts of it, and a fill a decode can have
    # (the random model calls no tool: no tool_s)
    phases = row["rollout/decode_s"] + row.get("rollout/tool_s", 0.0) + row.get("rollout/append_s", 0.0)
    assert 0 < phases <= row["time/rollout_s"] and row["rollout/segments"] >= 1
    assert 0 < row["rollout/decode_fill"] <= 1


def test_a_failing_gold_query_drops_its_prompt_and_the_run_goes_on(tiny_smollm_dir, tmp_path):
    """SQL training with one question whose gold query fails on its database: that prompt's rows leave
    the update (loss mask 0, counted), the other prompt trains, the step finishes."""
    c = _config(tiny_smollm_dir, tmp_path / "gold", steps=1)
    c.task = "sql"
    rows = [{"db_id": "concert_singer", "question": "How many singers are there?",
             "query": "SELECT count(*) FROM singer"},
            {"db_id": "concert_singer", "question": "How many bands are there?",
             "query": "SELECT count(*) FROM band"}]
    path = tmp_path / "rows.json"
    path.write_text(json.dumps(rows))
    c.data.train = [dict(reader="spider", path=str(path), db_root="data/spider/database", data_source="spider_x")]
    c.eval.n = 0
    c.reward.sql_shaping = "skyrl"
    c.output.save_rollouts = True
    tr = Trainer(c)
    row = read_metrics(tr.run()["metrics"])[-1]
    assert row["reward/dropped_prompts"] == 1.0 and row["reward/sql_gold_failed"] == 2.0
    assert row["reward/sql_format"] == 2.0 and row["reward/mean"] == -1.0  # the random model's format fails
    saved = [json.loads(line) for line in open(tmp_path / "gold" / "rollouts.jsonl")]
    assert sorted((r["question"], r["in_update"]) for r in saved) == [("How many bands are there?", False)] * 2 + \
        [("How many singers are there?", True)] * 2


@pytest.mark.slow  # CI budget: kept out of the default run (python -m pytest -m slow)
def test_launch_train_cli_with_overrides_and_resume(tiny_smollm_dir, tmp_path):
    """README's main command path: absl flags, ml_collections overrides, --resume, the summary."""
    import subprocess
    import sys
    root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    out = tmp_path / "cli"
    args = [sys.executable, "-m", "launch.train", "--config=configs/quickstart.py",
            f"--config.model.path={tiny_smollm_dir}", f"--config.output.dir={out}", "--config.warm_start=",
            "--config.eval.n=2",
            "--config.train.prompts_per_step=2", "--config.train.group_size=2", "--config.train.mini_batch=4",
            "--config.train.micro_batch=2", "--config.rollout.max_turns=1", "--config.rollout.max_tokens_per_turn=8",
            "--config.output.progress=False", "--config.mesh.shape=(1,1,1)"]
    env = dict(os.environ, XLA_FLAGS=xla_flags(1), JAX_PLATFORMS="cpu")
    first = subprocess.run(args + ["--config.train.steps=1"], cwd=root, env=env, capture_output=True, text=True,
                           timeout=600)
    assert first.returncode == 0, first.stderr[-3000:]
    assert "mean reward" in first.stdout and "no rollout reached an <answer>" in first.stdout
    assert (out / "reward_curve.png").is_file() and (out / "adapters" / "dart_adapters.json").is_file()
    second = subprocess.run(args + ["--config.train.steps=2", "--resume"], cwd=root, env=env, capture_output=True,
                            text=True, timeout=600)
    assert second.returncode == 0, second.stderr[-3000:]
    assert "resumed from checkpoint 1" in second.stderr
    rows = read_metrics(str(out / "metrics.jsonl"))
    assert [r["step"] for r in rows] == [0, 1, 2]
    # the host-memory release (on by default) is timed, and inside the stages it ran between
    assert all(0 < r["time/release_s"] <= r["time/rollout_s"] + r["time/update_s"] for r in rows if r["step"])
    # a new run starting from the exported DART adapter directory
    warm = subprocess.run([a if not a.startswith("--config.output.dir=") else f"--config.output.dir={out}-warm"
                           for a in args] + ["--config.train.steps=1", f"--config.init_from={out / 'adapters'}"],
                          cwd=root, env=env, capture_output=True, text=True, timeout=600)
    assert warm.returncode == 0, warm.stderr[-3000:]
    assert (tmp_path / "cli-warm" / "metrics.jsonl").is_file()
    bad = subprocess.run(args + ["--config.train.mini_batch=3"], cwd=root, env=env, capture_output=True, text=True,
                         timeout=600)
    assert bad.returncode != 0 and "must be a multiple of train.mini_batch (3)" in bad.stderr


def test_task_accuracy_scores_the_last_answer():
    from dart_jax.run.held_out import task_accuracy
    texts = ["<search> q </search>\n\n<information>Doc 1 Paris</information>\n\n<answer> Paris </answer>",
             "<answer> Lyon </answer> then <answer> the Paris </answer>", "no answer at all: Paris", ""]
    metas = [{"golden_answers": ["Paris"]}] * 4
    np.testing.assert_array_equal(task_accuracy("qa", texts, metas, np.zeros(4)), [1, 1, 0, 0])
    np.testing.assert_array_equal(task_accuracy("sql", texts, metas, np.asarray([1, -1, 0, 1])), [1, 0, 0, 1])


def test_shared_decode_layout_trains_the_same(tiny_smollm_dir, tmp_path):
    """rollout.decode_layout="shared": the run holds its frozen base per layer (no stacked tree, no
    decode copy), training loops over the layers instead of scanning them, and two steps end with the
    per-layer-copy run's adapters (same rollouts, same updates; fp32 summation order: 1e-5)."""
    outs = {}
    for layout in ("per_layer", "shared"):
        c = _config(tiny_smollm_dir, tmp_path / layout, steps=2)
        c.eval.n = 0
        c.rollout.decode_layout = layout
        t = Trainer(c)
        assert isinstance(t.base["layers"], tuple) == (layout == "shared")
        t.run()
        outs[layout] = (_leaves(t.state), read_metrics(os.path.join(str(tmp_path / layout), "metrics.jsonl")))
    (a, ma), (b, mb) = outs["per_layer"], outs["shared"]
    for x, y in zip(a, b):
        np.testing.assert_allclose(x, y, atol=1e-5, rtol=0)
    assert [m["rollout/response_tokens"] for m in ma] == [m["rollout/response_tokens"] for m in mb]
