"""Atomic sentinel tags: each tag is one token id in running text, so the router reads one id.

Tags are added as non-special `AddedToken`s (not normalised, no strip), so they survive decoding
with `skip_special_tokens=True` and match inside words and after spaces. Existing ids never move.
Their embedding rows (and untied output-head columns) start from a reference word's embedding
(mean over its sub-tokens) plus small Gaussian noise, so a new tag begins near a word with a
related meaning instead of at a random point.
"""

from __future__ import annotations

from typing import Mapping

import jax
import jax.numpy as jnp
import numpy as np
from tokenizers import AddedToken

from dart_jax.models.config import ModelConfig
from dart_jax.models.transformer import Params

# tag -> reference word whose embedding seeds the new row
SENTINEL_TAGS: dict[str, str] = {
    "<search>": "search",
    "</search>": "end",
    "<information>": "information",
    "</information>": "end",
    "<sql>": "query",
    "</sql>": "finish",
    "<observation>": "observation",
    "</observation>": "finish",
}


def sentinel_ids(tokenizer, tags=tuple(SENTINEL_TAGS)) -> dict[str, int]:
    """tag -> id, failing with the tag's name if it is not one token."""
    out = {}
    for tag in tags:
        ids = tokenizer.encode(tag, add_special_tokens=False)
        if len(ids) != 1:
            raise ValueError(f"sentinel tag {tag!r} is not atomic in this tokenizer: {ids}")
        out[tag] = ids[0]
    return out


def add_sentinel_tokens(tokenizer, tags: Mapping[str, str] = SENTINEL_TAGS) -> list[str]:
    """Adds the tags that are not already single tokens; returns the tags added."""
    missing = [t for t in tags if len(tokenizer.encode(t, add_special_tokens=False)) != 1]
    tokenizer.add_tokens([AddedToken(t, special=False, normalized=False, lstrip=False, rstrip=False,
                                     single_word=False) for t in missing])
    return missing


def grow_embeddings(base: Params, cfg: ModelConfig, tokenizer, tags: Mapping[str, str],
                    key: jax.Array, noise_scale: float = 0.01) -> tuple[Params, ModelConfig]:
    """Makes the vocabulary hold every tokenizer id and seeds each tag's row.

    row(tag) = mean_j E[ref_ids_j] + ε, ε ~ N(0, (noise_scale · std(E))²), for the embedding E and,
    when untied, the output head's column. Rows between the old size and the new one that belong
    to no tag (padding in some vocabularies) are left as they are or zero when newly created.
    """
    new_vocab = max(len(tokenizer), cfg.vocab_size)
    base = dict(base)
    tables = {"embed": 0} if cfg.tie_word_embeddings else {"embed": 0, "lm_head": 1}
    ids = sentinel_ids(tokenizer, tuple(tags))
    for name, axis in tables.items():
        table = np.asarray(jax.device_get(base[name]), np.float32)
        rows = table if axis == 0 else table.T
        std = float(rows[: cfg.vocab_size].std())
        if new_vocab > rows.shape[0]:
            rows = np.concatenate([rows, np.zeros((new_vocab - rows.shape[0], rows.shape[1]), np.float32)])
        for i, (tag, word) in enumerate(tags.items()):
            ref = tokenizer.encode(word, add_special_tokens=False)
            noise = np.asarray(jax.random.normal(jax.random.fold_in(key, i * 2 + axis), (rows.shape[1],)))
            rows[ids[tag]] = rows[ref].mean(axis=0) + noise_scale * std * noise
        table = rows if axis == 0 else rows.T
        base[name] = jnp.asarray(table, cfg.weight_dtype)
    return base, cfg.replace(vocab_size=new_vocab)
