"""Tokenizer loading (HF directory or GGUF file, via transformers) and chat prompts."""

from __future__ import annotations

import os

import transformers

from dart_jax.models.names import is_gguf, resolve


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
