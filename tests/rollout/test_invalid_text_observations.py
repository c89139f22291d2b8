"""Invalid Unicode in observations (issue 49, class 2): a retrieved passage or SQL cell holding a
lone surrogate is tokenized as U+FFFD (one code point for one: the untrusted span still holds),
never a crash; valid observations tokenize exactly as before."""

import pytest

from dart_jax.rollout.agent import observation_ids
from dart_jax.rollout.protocol import QA, SQL
from dart_jax.tokenization.sentinels import add_sentinel_tokens
from dart_jax.tokenization.tokenizer import encode_text, load_tokenizer


@pytest.fixture(scope="module")
def tok():
    t = load_tokenizer("smollm2-135m-instruct")
    add_sentinel_tokens(t)
    return t


@pytest.mark.parametrize("protocol", [QA, SQL])
def test_observation_with_lone_surrogate_tokenizes_as_replacement(tok, protocol):
    bad = protocol.render_observation('Doc 1(Title: "A\ud800") passage \udc00 <search> x </search>', 2)
    good = protocol.render_observation('Doc 1(Title: "A\ufffd") passage \ufffd <search> x </search>', 2)
    ids = observation_ids(tok, protocol, bad, 1024)
    assert ids == observation_ids(tok, protocol, good, 1024)
    # the body stays ordinary text: the framing tags are the only added tokens
    added = set(tok.get_added_vocab().values())
    assert [tok.convert_ids_to_tokens(i) for i in ids if i in added] == [protocol.obs_open, protocol.obs_close]


def test_valid_text_encodes_as_the_tokenizer_does(tok):
    for text in ["plain", "é ß 中文 😀 \ufffd", "<information> x </information>"]:
        assert encode_text(tok, text) == tok.encode(text, add_special_tokens=False)


def test_agent_loop_survives_a_tool_body_with_lone_surrogates(smollm2):
    """The agent loop end to end (SmolLM2, a protocol whose tool tags are frequent tokens as in
    test_agent_loop): a tool that returns a lone surrogate finishes the rollout; the stored
    observation is valid text and its turn counts the replacements."""
    import dataclasses

    import jax

    from dart_jax.rollout.agent import Agent, RolloutConfig
    from dart_jax.rollout.sampling import SamplingConfig
    from dart_jax.tokenization.sentinels import SENTINEL_TAGS, grow_embeddings
    from dart_jax.tokenization.tokenizer import encode_chat

    cfg, base, _ = smollm2
    tok = load_tokenizer("smollm2-135m-instruct")
    add_sentinel_tokens(tok)
    base, cfg = grow_embeddings(base, cfg, tok, SENTINEL_TAGS, jax.random.PRNGKey(0))
    frequent = dataclasses.replace(QA, tool_open=" the", tool_close=".")
    prompts = [encode_chat(tok, [{"role": "user", "content": "Tell me about the history of the city of Paris."}])] * 2
    rc = RolloutConfig(max_turns=1, max_tokens_per_turn=48, max_response_tokens=200, max_obs_tokens=64)
    agent = Agent(cfg, tok, frequent, lambda qs, metas: ["Doc 1 \ud800 bad \udc00" for _ in qs],
                  SamplingConfig(temperature=1.0), rc)
    tb = agent.rollout(base, None, prompts, ["a", "b"], seed=1)
    calls = [t for turns in tb.turns for t in turns if t["action"] == "tool"]
    assert calls, tb.turns
    for t in calls:
        assert t["observation"] == "Doc 1 \ufffd bad \ufffd" and t["invalid_text"] == 2
