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
from dart_jax.roles.router import RouterSpec

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


def token_rows(base: Params, cfg: ModelConfig) -> dict[str, np.ndarray]:
    """Host copies of the per-token tables as f32[V, D]: the embedding and, when untied, the
    output head transposed."""
    names = ("embed",) if cfg.tie_word_embeddings else ("embed", "lm_head")
    return {n: np.asarray(jax.device_get(base[n]), np.float32).T if n == "lm_head"
            else np.asarray(jax.device_get(base[n]), np.float32) for n in names}


def row_params(base: Params, cfg: ModelConfig, ids) -> dict:
    """The rows of token `ids` as a trainable tree: {"embed": f32[n, D]} (+ "lm_head" f32[n, D], the
    head's columns, when untied)."""
    idx = jnp.asarray(ids, jnp.int32)
    rows = {"embed": base["embed"][idx].astype(jnp.float32)}
    if not cfg.tie_word_embeddings:
        rows["lm_head"] = base["lm_head"][:, idx].T.astype(jnp.float32)
    return rows


def with_token_rows(base: Params, ids, rows: Mapping) -> Params:
    """`base` with rows["embed"][k] as token ids[k]'s embedding (and rows["lm_head"][k] as its head
    column): differentiable in `rows`, so a warm start can train the added tags' rows — with a tied
    head, a tag seeded from its word is otherwise almost the word itself at the output."""
    idx = jnp.asarray(ids, jnp.int32)
    out = dict(base)
    out["embed"] = base["embed"].at[idx].set(rows["embed"].astype(base["embed"].dtype))
    if "lm_head" in rows:
        out["lm_head"] = base["lm_head"].at[:, idx].set(rows["lm_head"].T.astype(base["lm_head"].dtype))
    return out


def set_token_rows(base: Params, cfg: ModelConfig, ids, rows: Mapping[str, np.ndarray],
                   vocab_size: int) -> tuple[Params, ModelConfig]:
    """Writes rows[name][k] as token ids[k]'s row of each table, growing the vocabulary to
    `vocab_size` (new rows zero). rows["lm_head"] is required exactly when the head is untied."""
    tables = token_rows(base, cfg)
    if set(rows) != set(tables):
        raise ValueError(f"token rows given for {sorted(rows)}, the model needs {sorted(tables)}")
    vocab = max(vocab_size, cfg.vocab_size)
    base = dict(base)
    for name, table in tables.items():
        table = np.array(table)  # a writable copy (host views of device arrays are read-only)
        if vocab > table.shape[0]:
            table = np.concatenate([table, np.zeros((vocab - table.shape[0], table.shape[1]), np.float32)])
        table[np.asarray(ids, np.int64)] = rows[name]
        base[name] = jnp.asarray(table.T if name == "lm_head" else table, cfg.weight_dtype)
    return base, cfg.replace(vocab_size=vocab)


def grow_embeddings(base: Params, cfg: ModelConfig, tokenizer, tags: Mapping[str, str],
                    key: jax.Array, noise_scale: float = 0.01) -> tuple[Params, ModelConfig]:
    """Makes the vocabulary hold every tokenizer id and seeds each tag's row.

    row(tag) = mean_j E[ref_ids_j] + ε, ε ~ N(0, (noise_scale · std(E))²), for the embedding E and,
    when untied, the output head's column. Rows between the old size and the new one that belong
    to no tag (padding in some vocabularies) are left as they are or zero when newly created.
    """
    ids = sentinel_ids(tokenizer, tuple(tags))
    rows = {}
    for axis, (name, table) in enumerate(token_rows(base, cfg).items()):
        std = float(table.std())
        seeded = []
        for i, (tag, word) in enumerate(tags.items()):
            ref = tokenizer.encode(word, add_special_tokens=False)
            noise = np.asarray(jax.random.normal(jax.random.fold_in(key, i * 2 + axis), (table.shape[1],)))
            seeded.append(table[ref].mean(axis=0) + noise_scale * std * noise)
        rows[name] = np.stack(seeded) if seeded else np.zeros((0, table.shape[1]), np.float32)
    return set_token_rows(base, cfg, [ids[t] for t in tags], rows, len(tokenizer))


def router_for_tags(tokenizer, open_tag: str, close_tag: str, convention: str = "dart_jax") -> RouterSpec:
    """The router ψ over one (open, close) tag pair, by their token ids in `tokenizer`."""
    ids = sentinel_ids(tokenizer, (open_tag, close_tag))
    return RouterSpec((ids[open_tag],), (ids[close_tag],), convention)
