"""A step's rollout in chunks (`rollout.chunk_rows`, rl/stages.rollout): decoded a few GRPO groups at a
time, the step gives the one-batch rollout's trajectories — the same ids, masks, routes, turns and
texts, and the same sampled log-probs to fp32 rounding (atol 1e-5: a chunk pads its prompts and cache
to its own widths, so the attention sums run over other padded lengths) — on a tiny random Llama with
SmolLM2's tokenizer, the real SQLite tool and tool tags it writes often. The reference is the
unchunked rollout, and a chunk drawn at the wrong row offset is shown to differ from it, so equality
is not an accident of the seed."""

import dataclasses

import jax.numpy as jnp
import numpy as np
import pytest

from configs import quickstart
from dart_jax.checkpoints.registry import load_model
from dart_jax.models.transformer import hidden_states
from dart_jax.rl import stages
from dart_jax.rollout.agent import Agent, RolloutConfig, tool_for
from dart_jax.rollout.protocol import SQL
from dart_jax.rollout.sampling import SamplingConfig
from dart_jax.rollout.tasks import spider_rows, sql_task
from dart_jax.run.spec import run_spec
from dart_jax.tokenization.tokenizer import load_tokenizer
from dart_jax.tools.sqlite_exec import SQLiteTool

FREQUENT = dataclasses.replace(SQL, tool_open=" the", tool_close=".")
ROLLOUT = dict(max_turns=2, max_tokens_per_turn=24, max_response_tokens=160, max_obs_tokens=40, invalid_action="none")
G, SEED = 2, 11


@pytest.fixture(scope="module")
def policy(tiny_smollm_dir):
    """(cfg, base, tokenizer, 3 Spider rows): the tool tags' output columns point along the prompt's mean
    final hidden state, so the random model opens and closes tool spans often (rollout/test_compose)."""
    cfg, base = load_model(tiny_smollm_dir)
    tok = load_tokenizer(tiny_smollm_dir)
    rows = spider_rows(3)
    prompt = sql_task(tok, rows[:1])[0][0]
    h, _ = hidden_states(base, None, jnp.asarray([prompt]), jnp.arange(len(prompt))[None], None, None, cfg=cfg)
    m = np.asarray(h[0].mean(0), np.float32)
    head = np.array(base["lm_head"])
    for tag in (" the", "."):
        head[:, tok.encode(tag, add_special_tokens=False)[0]] = 10.0 * m / (m @ m)
    return cfg, dict(base, lm_head=jnp.asarray(head)), tok, rows


def agent(cfg, tok, chunk_rows: int) -> Agent:
    return Agent(cfg, tok, FREQUENT, tool_for(SQL, SQLiteTool(timeout_s=5.0)), SamplingConfig(temperature=1.0),
                 RolloutConfig(**ROLLOUT, chunk_rows=chunk_rows))


def test_chunked_rollout_is_the_one_batch_rollout(policy):
    cfg, base, tok, rows = policy
    one = stages.rollout(agent(cfg, tok, 0), (base, None), rows, G, SEED)
    # 3 groups of 2 in chunks of at most 4 trajectories: 2 groups, then 1
    chunked = stages.rollout(agent(cfg, tok, 4), (base, None), rows, G, SEED)
    assert one.tb.tool_calls().sum() >= 2, one.tb.turns  # spans, tool calls and observations happen
    assert one.tb.batch_size == chunked.tb.batch_size == 6
    for k in ("ids", "positions", "loss_mask", "route_ids", "prompt_len", "length"):
        np.testing.assert_array_equal(getattr(chunked.tb, k), getattr(one.tb, k), err_msg=k)
    np.testing.assert_allclose(chunked.tb.sampler_logprobs, one.tb.sampler_logprobs, atol=1e-5, rtol=0)
    for k in ("uids", "finish_reason", "turns", "response_text", "reward_text", "observed"):
        assert getattr(chunked.tb, k) == getattr(one.tb, k), k
    assert chunked.rows == one.rows and chunked.metas == one.metas

    # the last group alone draws as rows 4-5 of the batch only at its offset in the batch
    last = agent(cfg, tok, 0)
    at_offset = stages.rollout(last, (base, None), rows[2:], G, SEED, row_offset=2 * G)
    at_zero = stages.rollout(last, (base, None), rows[2:], G, SEED)
    n = at_offset.tb.ids.shape[1]
    np.testing.assert_array_equal(at_offset.tb.ids, one.tb.ids[4:, :n])
    assert at_zero.tb.response_text != one.tb.response_text[4:]


def test_chunk_rows_must_hold_whole_groups(policy):
    cfg, base, tok, rows = policy
    c = quickstart.get_config()
    c.train.update(prompts_per_step=2, group_size=2, mini_batch=4, micro_batch=2)
    c.rollout.chunk_rows = 3
    with pytest.raises(ValueError) as e:
        run_spec(c)
    assert "rollout.chunk_rows=3" in str(e.value) and "train.group_size (2)" in str(e.value)
    with pytest.raises(ValueError, match=r"rollout\.chunk_rows=3 .*train\.group_size \(2\)"):
        stages.rollout(agent(cfg, tok, 3), (base, None), rows, G, SEED)
    c.rollout.chunk_rows = 4
    run_spec(c)


def test_chunk_rows_is_a_layout_setting():
    """A resumed run or an evaluation may change chunk_rows: it is not part of what shapes a trajectory."""
    from dart_jax.rollout.agent import trajectory_settings
    assert "chunk_rows" not in trajectory_settings(quickstart.get_config().rollout)
