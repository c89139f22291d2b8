"""Sentinel tags are single ids in real prompts; existing ids unchanged; embedding rows seeded."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from dart_jax.models.config import ModelConfig
from dart_jax.models.transformer import init_params
from dart_jax.tokenization.sentinels import SENTINEL_TAGS, add_sentinel_tokens, grow_embeddings, sentinel_ids
from dart_jax.tokenization.tokenizer import encode_chat, load_tokenizer

SEARCH_R1_PROMPT = (
    "Answer the given question. You must conduct reasoning inside <think> and </think> first every "
    "time you get new information. After reasoning, if you find you lack some knowledge, you can call "
    "a search engine by <search> query </search> and it will return the top searched results between "
    "<information> and </information>. Question: who wrote war and peace?")
TRAJECTORY = ("<think>I need the author.</think>\n<search> war and peace author</search>\n\n"
              "<information>Doc 1(Title: \"War and Peace\") War and Peace is a novel by Leo Tolstoy."
              "</information>\n\n<answer> Leo Tolstoy </answer>")
SQL_TURN = ("<think>count singers</think><sql>SELECT count(*) FROM singer</sql>\n\n<observation>"
            "| count(*) |\n| 6 |\n<reminder>You have 4 turns left to complete the task.</reminder>"
            "</observation>\n\n<solution>SELECT count(*) FROM singer</solution>")


@pytest.fixture(scope="module")
def tok():
    t = load_tokenizer("smollm2-135m-instruct")
    before = {s: t.encode(s, add_special_tokens=False) for s in (SEARCH_R1_PROMPT, "plain text, no tags.")}
    added = add_sentinel_tokens(t)
    assert added == list(SENTINEL_TAGS)
    return t, before


def test_each_tag_is_one_id_in_running_text(tok):
    t, _ = tok
    ids = sentinel_ids(t)
    assert sorted(ids.values()) == list(range(49152, 49160))
    for text in (TRAJECTORY, SQL_TURN, "x<search>y</search>z", " <sql> </sql> "):
        enc = t.encode(text, add_special_tokens=False)
        for tag, tid in ids.items():
            assert enc.count(tid) == text.count(tag), (tag, text)
        assert t.decode(enc) == text
        assert t.decode(enc, skip_special_tokens=True) == text


def test_tags_atomic_inside_chat_template(tok):
    t, _ = tok
    ids = encode_chat(t, [{"role": "user", "content": SEARCH_R1_PROMPT},
                          {"role": "assistant", "content": TRAJECTORY}], add_generation_prompt=False)
    text = t.decode(ids)
    assert text.startswith("<|im_start|>system") and "<|im_start|>assistant\n<think>" in text
    tid = sentinel_ids(t)
    assert ids.count(tid["<search>"]) == 2 and ids.count(tid["</information>"]) == 2


def test_existing_ids_unchanged(tok):
    t, before = tok
    assert t.encode("plain text, no tags.", add_special_tokens=False) == before["plain text, no tags."]
    assert len(t) == 49160
    ref = load_tokenizer("smollm2-135m-instruct")
    for tid in (0, 1, 2, 500, 49151):
        assert t.convert_ids_to_tokens(tid) == ref.convert_ids_to_tokens(tid)


def test_adding_twice_adds_nothing(tok):
    t, _ = tok
    assert add_sentinel_tokens(t) == []


@pytest.mark.parametrize("tied", [True, False])
def test_embedding_rows_grown_and_seeded(tok, tied):
    t, _ = tok
    cfg = ModelConfig(model_type="llama", vocab_size=49152, hidden_size=16, intermediate_size=32,
                      num_layers=1, num_heads=2, num_kv_heads=1, head_dim=8, tie_word_embeddings=tied)
    base = init_params(cfg, jax.random.PRNGKey(0))
    new_base, new_cfg = grow_embeddings(base, cfg, t, SENTINEL_TAGS, jax.random.PRNGKey(1))
    assert new_cfg.vocab_size == 49160 and new_base["embed"].shape == (49160, 16)
    np.testing.assert_array_equal(np.asarray(new_base["embed"][:49152]), np.asarray(base["embed"]))
    e = np.asarray(base["embed"])
    std = e.std()
    for tag, word in SENTINEL_TAGS.items():
        ref_ids = t.encode(word, add_special_tokens=False)
        row = np.asarray(new_base["embed"][t.convert_tokens_to_ids(tag)])
        dist = np.abs(row - e[ref_ids].mean(0))
        assert 0 < dist.max() < 0.05 * std, tag
    if not tied:
        assert new_base["lm_head"].shape == (16, 49160)
        np.testing.assert_array_equal(np.asarray(new_base["lm_head"][:, :49152]), np.asarray(base["lm_head"]))
        sid = t.convert_tokens_to_ids("<search>")
        ref = np.asarray(base["lm_head"])[:, t.encode("search", add_special_tokens=False)].mean(1)
        assert np.abs(np.asarray(new_base["lm_head"][:, sid]) - ref).max() < 0.05 * std
    assert new_base["embed"].dtype == jnp.float32


def test_tags_a_checkpoint_already_has_keep_their_rows(tmp_path):
    """An HF directory exported with its tags (a verl / DART run) must not get its trained tag rows
    re-seeded when it is loaded again; tags it lacks are still added and seeded."""
    import tiny_models
    from dart_jax.checkpoints.registry import load_tagged_model
    t = load_tokenizer("smollm2-135m-instruct")
    t.add_tokens(["<search>", "</search>"])  # two tags already trained in this "checkpoint"
    tiny_models.build("llama", str(tmp_path), vocab_size=len(t), hidden_size=32, intermediate_size=48,
                      num_attention_heads=4, num_key_value_heads=2, bos_token_id=1, eos_token_id=2, pad_token_id=2)
    t.save_pretrained(str(tmp_path))
    from dart_jax.checkpoints.registry import load_model
    _, raw = load_model(str(tmp_path))
    cfg, base, tok = load_tagged_model(str(tmp_path), jax.random.PRNGKey(0))
    ids = sentinel_ids(tok)
    for tag in ("<search>", "</search>"):
        np.testing.assert_array_equal(np.asarray(base["embed"][ids[tag]]), np.asarray(raw["embed"][ids[tag]]))
    assert cfg.vocab_size == len(tok) == raw["embed"].shape[0] + len(SENTINEL_TAGS) - 2
    fresh = np.asarray(base["embed"][ids["<information>"]])
    assert np.abs(fresh).sum() > 0  # seeded, not left at zero
