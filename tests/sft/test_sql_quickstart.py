"""The SQL quickstart's two configs end to end, one step each, on a tiny random Llama with
SmolLM2's real tokenizer and the real Spider databases of the shipped split: the warm start builds
its demonstrations on training databases only and checks the protocol on held-out databases, and
the GRPO quickstart starts from that warm start, trains on the other query fold and evaluates on the
held-out databases."""

import json
import os

import numpy as np

from configs import quickstart_sql, sft_sql_quickstart
from dart_jax.data.readers import query_fold
from dart_jax.data.spider_split import DK_COPIES, HELDOUT_DBS, TRAIN_DBS
from dart_jax.data.sql_hardness import hardness
from dart_jax.rl.trainer import Trainer
from dart_jax.run.metrics import read_metrics
from dart_jax.sft.trainer import SFTTrainer


def _small(c, model_dir, out):
    c.model.path = model_dir
    c.rollout.update(dict(max_turns=2, max_tokens_per_turn=8, max_obs_tokens=64, max_response_tokens=96))
    c.output.update(dict(dir=str(out), progress=False, tensorboard=False))
    return c


def test_sql_warm_start_then_grpo_one_step_each(tiny_smollm_dir, tmp_path):
    c = _small(sft_sql_quickstart.get_config(), tiny_smollm_dir, tmp_path / "sft")
    c.sft.data = [dict(spec, limit=2) for spec in c.sft.data]
    c.sft.check_data = [dict(spec, limit=2) for spec in c.sft.check_data]
    c.sft.update(dict(val_size=1, batch_size=4, micro_batch=2, protocol_check=2, export_dtype="float32"))
    tr = SFTTrainer(c)
    assert {d["db_id"] for d in tr.train + tr.val} <= set(TRAIN_DBS)
    assert all(query_fold(d, 2, DK_COPIES) == sft_sql_quickstart.SFT_FOLD for d in tr.train + tr.val)
    assert {r["db_id"] for r in tr.check_rows} <= set(HELDOUT_DBS) and len(tr.check_rows) == 2
    # a demonstration: an exploring <sql> whose observation is the real database's rows, then the gold query
    demo = tr.train[0]
    assert "<sql> SELECT * FROM" in demo["pieces"][0]["text"] and "<observation>|" in demo["pieces"][1]["text"]
    assert os.path.isfile(demo["db_path"]) and demo["query"].split()[0].upper() == "SELECT"
    out = tr.run()
    s = out["summary"]
    assert s["steps"] == 1 and s["train_demos"] == 7
    for side in ("before", "after"):
        assert s[side]["n"] == 2 and 0 <= s[side]["correct"] <= 2, s[side]
    manifest = json.loads(open(os.path.join(out["export"], "dart_adapters.json")).read())
    assert manifest["kind"] == "warm_start"

    g = _small(quickstart_sql.get_config(), tiny_smollm_dir, tmp_path / "grpo")
    g.warm_start = out["export"]
    g.eval.data = [dict(spec, limit=2) for spec in g.eval.data]
    g.eval.n = 2
    g.train.update(dict(steps=1, prompts_per_step=2, group_size=2, mini_batch=4, micro_batch=2))
    g.optim.total_steps = 1
    g.output.export_adapters = False
    t = Trainer(g)
    assert {r["db_id"] for r in t.rows} <= set(TRAIN_DBS)
    assert all(query_fold(r, 2, DK_COPIES) == sft_sql_quickstart.RL_FOLD for r in t.rows)
    assert len(t.rows) == 205 and all(hardness(r["query"]) == quickstart_sql.MAX_HARDNESS for r in t.rows)
    assert {r["db_id"] for r in t.eval_rows} <= set(HELDOUT_DBS)
    res = t.run()
    rows = read_metrics(res["metrics"])
    evals = [r for r in rows if "eval/correct" in r]
    assert [r["step"] for r in evals] == [0, 1] and all(r["eval/n"] == 2 for r in evals)
    step = [r for r in rows if "reward/mean" in r]
    assert len(step) == 1 and np.isfinite(step[0]["reward/mean"])
    # every trajectory was scored against its gold query on its real training database: the paper's ±1
    trajs = [json.loads(line) for line in open(tmp_path / "grpo" / "rollouts.jsonl")]
    assert len(trajs) == 4 and all(t["score"] in (-1.0, 1.0) for t in trajs)
    assert all(t["db_id"] in TRAIN_DBS and os.path.isfile(t["db_path"]) for t in trajs)
    np.testing.assert_allclose(np.mean([t["score"] for t in trajs]), step[0]["reward/mean"], atol=1e-6)
    # train.share_prefix: each group's schema prompt ran once in the update, not once per row
    assert t.plan.share_prefix
    assert 0 < step[0]["actor/forward_tokens"] < step[0]["actor/row_tokens"]
