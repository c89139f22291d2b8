"""Tokenizer loading (HF directory or GGUF file, via transformers) and chat prompts."""

from __future__ import annotations

import os

import transformers

from dart_jax.checkpoints.registry import is_gguf, resolve


def load_tokenizer(name_or_path: str):
    path = resolve(name_or_path)
    if is_gguf(path):
        return transformers.AutoTokenizer.from_pretrained(
            os.path.dirname(os.path.abspath(path)), gguf_file=os.path.basename(path))
    if not os.path.isdir(path):
        raise ValueError(f"{path}: expected an HF model directory or a .gguf file")
    return transformers.AutoTokenizer.from_pretrained(path)


def encode_chat(tokenizer, messages: list[dict], add_generation_prompt: bool = True) -> list[int]:
    """Token ids of `messages` rendered by the tokenizer's own chat template."""
    if not getattr(tokenizer, "chat_template", None):
        raise ValueError("this tokenizer has no chat template")
    out = tokenizer.apply_chat_template(messages, tokenize=True, add_generation_prompt=add_generation_prompt)
    if isinstance(out, dict) or hasattr(out, "keys"):
        out = out["input_ids"]
    return [int(i) for i in out]


def stop_ids(tokenizer, cfg_eos: tuple[int, ...] = ()) -> tuple[int, ...]:
    """EOS / end-of-turn ids: the config's, the tokenizer's eos, and <|im_end|> / <|eot_id|>."""
    ids = set(cfg_eos)
    if tokenizer.eos_token_id is not None:
        ids.add(int(tokenizer.eos_token_id))
    for tok in ("<|im_end|>", "<|eot_id|>", "<|endoftext|>"):
        tid = tokenizer.convert_tokens_to_ids(tok)
        if isinstance(tid, int) and tid != tokenizer.unk_token_id and tid is not None:
            ids.add(tid)
    return tuple(sorted(ids))


def load_tagged_model(name_or_path: str, key, mesh=None, **overrides):
    """Model + tokenizer with the sentinel tags added and their embedding rows seeded: the
    starting point of every DART run. -> (cfg, base, tokenizer). `overrides` set ModelConfig
    fields (dtypes, remat, scan). A tag the checkpoint already has as one token with a row (a
    verl / DART run exported with its tags, Qwen3's native <think>) keeps its row: only tags added
    here, or without a row, are seeded."""
    import logging

    from dart_jax.checkpoints.registry import load_model
    from dart_jax.tokenization.sentinels import SENTINEL_TAGS, add_sentinel_tokens, grow_embeddings, sentinel_ids
    path = resolve(name_or_path)
    cfg, base = load_model(path, mesh=mesh, **overrides)
    tok = load_tokenizer(path)
    added = set(add_sentinel_tokens(tok))
    ids = sentinel_ids(tok)
    seed = {t: w for t, w in SENTINEL_TAGS.items() if t in added or ids[t] >= cfg.vocab_size}
    kept = [t for t in SENTINEL_TAGS if t not in seed]
    if kept:
        logging.getLogger(__name__).info("%s: tags already in the vocabulary keep their rows: %s", path, kept)
    if seed or len(tok) > cfg.vocab_size:
        base, cfg = grow_embeddings(base, cfg, tok, seed, key)
    return cfg, base, tok
