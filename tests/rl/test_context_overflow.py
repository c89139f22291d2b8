"""Prompts longer than the model's context (max_position_embeddings) are refused before any forward,
by the rule of rollout.tasks.overlong: len(prompt) + min(max_response_tokens, max_tokens_per_turn) >
context. In training the refused prompt's group keeps its place as one-token rows without loss and is
counted (`rollout/prompts_overlong`); a step whose every prompt is refused stops with a one-line error;
held-out and evaluation questions are skipped and counted. A prompt that fits never decodes past the
context: each row's response budget ends at context − len(prompt), finish "length". On a tiny random
Llama with SmolLM2's real tokenizer and the QA prompts."""

import json

import jax
import numpy as np
import pytest

from configs import quickstart
from dart_jax.adapters.method import MethodSpec
from dart_jax.checkpoints.registry import load_model
from dart_jax.errors import UserError
from dart_jax.rewards.training import QAReward
from dart_jax.rl import stages
from dart_jax.rl.trainer import Trainer
from dart_jax.rollout.agent import Agent, RolloutConfig, SinglePolicy
from dart_jax.rollout.protocol import QA
from dart_jax.rollout.sampling import SamplingConfig
from dart_jax.rollout.tasks import fitting_rows, overlong, qa_task
from dart_jax.run.metrics import read_metrics
from dart_jax.tokenization.sentinels import SENTINEL_TAGS, add_sentinel_tokens, grow_embeddings
from dart_jax.tokenization.tokenizer import load_tokenizer

SHORT = [{"id": "s1", "question": "who wrote war and peace?", "golden_answers": ["Leo Tolstoy"]},
         {"id": "s2", "question": "what is the capital of france?", "golden_answers": ["Paris"]}]
LONG = {"id": "l1", "question": "who wrote war and peace? " + "and then what happened next " * 40,
        "golden_answers": ["Leo Tolstoy"]}
ROLLOUT = dict(max_turns=1, max_tokens_per_turn=16, max_response_tokens=128, max_obs_tokens=64,
               invalid_action="none")
G = 2


def no_tool(queries, metas):
    return ["no results"] * len(queries)


@pytest.fixture(scope="module")
def model(tiny_smollm_dir):
    cfg, base = load_model(tiny_smollm_dir)
    tok = load_tokenizer(tiny_smollm_dir)
    add_sentinel_tokens(tok)
    base, cfg = grow_embeddings(base, cfg, tok, SENTINEL_TAGS, jax.random.PRNGKey(0))
    lens = [len(p) for p in qa_task(tok, SHORT + [LONG])[0]]
    # a context the short prompts fit in (with 40 positions to spare) and the long one does not
    context = max(lens[:2]) + 16 + 40
    assert lens[2] + 16 > context
    return cfg.replace(max_position_embeddings=context), base, tok, lens


def agent(cfg, tok, **kw) -> Agent:
    return Agent(cfg, tok, QA, no_tool, SamplingConfig(temperature=1.0), RolloutConfig(**{**ROLLOUT, **kw}))


def test_the_rule(model):
    cfg, _, tok, lens = model
    rc = RolloutConfig(**ROLLOUT)
    c = cfg.max_position_embeddings
    assert overlong([[0] * (c - 16), [0] * (c - 15)], c, rc) == [False, True]  # one full turn must fit
    rows, n = fitting_rows(tok, "qa", SHORT + [LONG, {"id": "x", "question": "no reference"}], c, rc)
    assert n == 1 and [r["id"] for r in rows] == ["s1", "s2", "x"]  # rows without a reference are not encoded


def test_overlong_prompt_refused_before_any_forward_and_dropped_from_the_loss(model):
    cfg, base, tok, lens = model
    rows = [SHORT[0], LONG, SHORT[1]]
    ag = agent(cfg, tok)
    ro = stages.rollout(ag, (base, None), rows, G, seed=5)
    tb = ro.tb
    np.testing.assert_array_equal(ro.overlong, [False, False, True, True, False, False])
    assert tb.finish_reason[2:4] == ["overlong"] * 2 and list(tb.length[2:4]) == [1, 1]
    assert tb.uids[2:4] == ["l1", "l1"] and tb.ids[2, 0] == qa_task(tok, [LONG])[0][0][0]
    assert int(tb.positions.max()) < cfg.max_position_embeddings  # no position past the context
    # the prompts around it draw as they would at their offsets in the batch: the refused one took no part
    for k, row in ((0, SHORT[0]), (4, SHORT[1])):
        alone = stages.rollout(ag, (base, None), [row], G, seed=5, row_offset=k).tb
        n = alone.ids.shape[1]
        np.testing.assert_array_equal(tb.ids[k:k + G, :n], alone.ids)
        assert tb.finish_reason[k:k + G] == alone.finish_reason
    # scoring: the refused group carries no loss and no advantage; the step counts it
    sc = stages.score(ro, QAReward(), MethodSpec("dart"), ag.spec.router, pad_multiple=8)
    assert list(sc.valid) == [True, True, False, False, True, True]
    assert sc.batch["loss_mask"][2:4].sum() == 0 and not sc.batch["advantages"][2:4].any()
    upd = [{"loss": 0.0, "pg_loss": 0.0, "entropy": 0.0, "pg_clipfrac": 0.0, "pg_clipfrac_lower": 0.0,
            "ppo_kl": 0.0, "grad_norm": 0.0, "lr": 0.1, "skipped": 0.0}]
    m = stages.step_metrics(ro, sc, upd, "qa", False, False, {"rollout": 1.0})
    assert m["rollout/prompts_overlong"] == 1.0 and m["reward/dropped_prompts"] == 1.0
    assert m["protocol/answer_rate"] + sum(m[f"protocol/finish_{r}"] for r in ("invalid", "length", "budget")) == 1.0


def test_the_sampler_refuses_a_prompt_with_no_room(model):
    cfg, base, tok, lens = model
    long_prompt = qa_task(tok, [LONG])[0]
    with pytest.raises(ValueError, match="leaves no room for a response"):
        SinglePolicy(agent(cfg, tok), base, None, long_prompt, seed=0)


def test_responses_stop_at_the_context(model):
    """A prompt that fits the rule but not with max_response_tokens: the response is capped at
    context − len(prompt) and the row finishes "length" (here: turn 1 of 16 tokens, the corrective
    message, then a second turn cut at the context)."""
    cfg, base, tok, lens = model
    ag = agent(cfg, tok, max_turns=2, invalid_action="search_r1")
    obs = len(ag.obs_ids(QA.invalid_message))
    p = lens[0]
    small = cfg.replace(max_position_embeddings=p + 16 + obs + 5)  # 5 positions left for turn 2
    ag = agent(small, tok, max_turns=2, invalid_action="search_r1")
    prompts = qa_task(tok, [SHORT[0]] * 4)[0]
    tb = ag.rollout(base, None, prompts, ["s1"] * 4, seed=3)
    capped = [i for i in range(4) if tb.finish_reason[i] == "length"]
    assert capped, tb.finish_reason  # the random model writes no answer: every row runs into the cap
    for i in range(4):
        assert tb.length[i] <= small.max_position_embeddings
    assert all(tb.length[i] == small.max_position_embeddings for i in capped)
    assert any(tb.turns[i][-1]["tokens"] == 5 for i in capped)  # turn 2 was given the 5 positions left


def _config(model_dir, out_dir, train_rows, eval_rows):
    c = quickstart.get_config()
    c.model.path = model_dir
    c.warm_start = ""
    c.train.steps = 1
    c.train.prompts_per_step = len(train_rows)
    c.train.group_size = G
    c.train.mini_batch = G * len(train_rows)
    c.train.micro_batch = 1
    c.train.shuffle = False
    for k, v in ROLLOUT.items():
        setattr(c.rollout, k, v)
    c.output.dir = str(out_dir)
    c.output.progress = False
    c.output.tensorboard = False
    c.output.export_adapters = False
    c.mesh.shape = (1, 1, 1)
    for name, rows in (("train", train_rows), ("eval", eval_rows)):
        path = out_dir.parent / f"{out_dir.name}_{name}.jsonl"
        path.write_text("".join(json.dumps(r) + "\n" for r in rows))
        entry = [dict(reader="flashrag", path=str(path), data_source="nq")]
        if name == "train":
            c.data.train = entry
        else:
            c.eval.data, c.eval.n, c.eval.every = entry, len(rows), 0
    return c


@pytest.fixture(scope="module")
def small_context_dir(tiny_smollm_dir, model, tmp_path_factory):
    """tiny_smollm_dir with config.json's max_position_embeddings set to the test's context."""
    import shutil
    path = tmp_path_factory.mktemp("small_ctx")
    shutil.copytree(tiny_smollm_dir, path, dirs_exist_ok=True)
    cfg = json.loads((path / "config.json").read_text())
    cfg["max_position_embeddings"] = model[0].max_position_embeddings
    (path / "config.json").write_text(json.dumps(cfg))
    return str(path)


def test_training_counts_refused_prompts_and_stops_when_all_are(small_context_dir, tmp_path):
    """The trainer leaves refused training and held-out questions out at start, counted in the metrics;
    a data set with no question that fits is one line before any step."""
    held_out = [{"id": "e1", "question": "who painted the mona lisa?", "golden_answers": ["Leonardo"]},
                dict(LONG, id="e2", question="who painted the mona lisa? " + "and what next " * 60)]
    c = _config(small_context_dir, tmp_path / "run", [SHORT[0], LONG], held_out)
    c.output.save_rollouts = True
    tr = Trainer(c)
    assert tr.eval_overlong == 1 and [r["id"] for r in tr.eval_rows] == ["nq-e1"]
    assert tr.train_overlong == 1 and [r["id"] for r in tr.rows] == ["nq-s1"]
    rows = [r for r in read_metrics(tr.run()["metrics"]) if "reward/mean" in r]
    assert rows[-1]["rollout/train_questions_overlong"] == 1.0 and rows[-1]["rollout/prompts_overlong"] == 0.0
    assert rows[-1]["eval/skipped_overlong"] == 1.0
    assert np.isfinite(rows[-1]["actor/loss"])
    saved = [json.loads(line) for line in open(tmp_path / "run" / "rollouts.jsonl")]
    assert {(r["uid"], r["in_update"]) for r in saved} == {("nq-s1", True)}
    assert len(saved) == G * c.train.prompts_per_step * len(rows)  # the one question that fits, every time

    with pytest.raises(UserError, match=r"every training question's prompt leaves less than 16 response tokens"):
        Trainer(_config(small_context_dir, tmp_path / "all", [LONG, dict(LONG, id="l2", question="x " * 400)],
                        held_out[:1]))


def test_evaluation_skips_and_counts_overlong_questions(tiny_smollm_dir, model, tmp_path):
    """launch.evaluate's path: the questions whose prompts break the rule are skipped before any
    rollout and counted in the results (`skipped_overlong`); the others are evaluated."""
    import shutil

    from configs import evaluate as eval_config
    from dart_jax.eval.datasets import EVAL_SETS, load_set
    from dart_jax.eval.job import evaluate
    from dart_jax.eval.runner import EvalOptions
    tok = model[2]
    rows, _ = load_set(EVAL_SETS["nq"], 4)
    lens = [len(p) for p in qa_task(tok, rows)[0]]
    context = min(lens) + 12  # max_tokens_per_turn 12: only the shortest prompts fit
    refused = sum(n + 12 > context for n in lens)
    assert 0 < refused < len(rows)
    path = tmp_path / "model"
    shutil.copytree(tiny_smollm_dir, path)
    cfg = json.loads((path / "config.json").read_text())
    (path / "config.json").write_text(json.dumps(dict(cfg, max_position_embeddings=context)))
    c = eval_config.get_config("qa")
    c.model.path = str(path)
    c.retriever.topk = 1
    c.rollout.max_turns, c.rollout.max_tokens_per_turn, c.rollout.max_obs_tokens = 1, 12, 64
    c.rollout.max_response_tokens = 128
    c.mesh.shape = (1, 1, 1)
    out = evaluate(c, str(tmp_path / "eval"), ["nq"], EvalOptions(limit=4, batch=4, progress=False))
    nq = out["datasets"]["nq"]
    assert nq["skipped_overlong"] == refused and nq["questions"] == nq["trajectories"] == len(rows) - refused
    recs = [json.loads(line) for line in open(tmp_path / "eval" / "per_question.jsonl")]
    assert all(r["response_tokens"] <= 12 for r in recs)
