"""Fixtures of the serving tests: a tiny random Llama with SmolLM2's tokenizer whose output head favours
two frequent tokens used as the tool tags (" the" opens, "." closes), so random text makes tool calls;
the tool is the real lexical retriever over lab world 1's corpus."""

import dataclasses
import os

import numpy as np
import pytest

from dart_jax.checkpoints.registry import load_model
from dart_jax.rollout.agent import Agent, RolloutConfig, tool_for
from dart_jax.rollout.protocol import QA
from dart_jax.rollout.sampling import SamplingConfig
from dart_jax.tokenization.sentinels import SENTINEL_TAGS, add_sentinel_tokens, grow_embeddings
from dart_jax.tokenization.tokenizer import encode_chat, load_tokenizer
from dart_jax.tools.lexical import LexicalRetriever, build_lexical_index
from dart_jax.tools.retrieval import RetrievalTool

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
FREQUENT = dataclasses.replace(QA, tool_open=" the", tool_close=".")
RC = RolloutConfig(max_turns=2, max_tokens_per_turn=40, max_response_tokens=260, max_obs_tokens=64,
                   invalid_action="search_r1")
QUESTIONS = ["Who founded the Pomorn Brothers?", "When was the Furnish Bridge published?",
             "Where was the mayor of Kalwick born?", "How many pages does the book have?",
             "Which company employs the most people?", "Is the town older than the firm?"]


@pytest.fixture(scope="session")
def serve_setup(tiny_smollm_dir, tmp_path_factory):
    """(agent, base, prompts): the agent's protocol is FREQUENT, its tool the lexical retriever."""
    import jax
    tok = load_tokenizer(tiny_smollm_dir)
    add_sentinel_tokens(tok)
    cfg, base = load_model(tiny_smollm_dir)
    base, cfg = grow_embeddings(base, cfg, tok, SENTINEL_TAGS, jax.random.PRNGKey(0))
    prompts = [encode_chat(tok, [{"role": "user", "content": q}]) for q in QUESTIONS]
    base = favour(base, cfg, prompts, [tok.encode(t, add_special_tokens=False)[0] for t in (" the", ".")])
    index = build_lexical_index(os.path.join(ROOT, "data/lab/world1/corpus.jsonl"),
                                str(tmp_path_factory.mktemp("lex")))
    tool = tool_for(QA, RetrievalTool(LexicalRetriever(index), topk=1))
    agent = Agent(cfg, tok, FREQUENT, tool, SamplingConfig(temperature=1.0), RC)
    return agent, base, prompts


def favour(base, cfg, prompts, ids, logit=9.0):
    """The random model's output head made to write `ids` often: their head columns point along the
    mean final hidden state (logit ≈ `logit` on average, 49k-way softmax), so random text holds tool
    tags and the loop pauses, resumes and finishes in every way."""
    import jax.numpy as jnp

    from dart_jax.models.generate import left_pad
    from dart_jax.models.transformer import hidden_states
    tokens, positions = left_pad(prompts, 0)
    h, _ = hidden_states(base, None, tokens, positions, None, None, cfg=cfg)
    m = np.asarray(h, np.float32)[np.asarray(positions) >= 0].mean(0)
    head = np.array(base["lm_head"], np.float32)
    head[:, ids] = (m / (m @ m) * logit)[:, None]
    return {**base, "lm_head": jnp.asarray(head, base["lm_head"].dtype)}
