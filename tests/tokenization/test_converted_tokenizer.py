"""A GGUF's tokenizer is converted by transformers once and kept (dart_jax/tokenization/tokenizer.py
`converted_dir`): the kept copy is the conversion (the same tokenizer JSON, added and special tokens,
chat template, and the same ids for every text here, before and after the sentinel tags are added);
it is used instead of converting again; a damaged copy is converted again; a changed file gets its
own copy. The embedded SmolLM2 GGUF, a cache root in a temporary directory."""

import logging
import os
import shutil

import pytest
import transformers

from dart_jax.models.names import resolve
from dart_jax.tokenization.sentinels import add_sentinel_tokens
from dart_jax.tokenization.tokenizer import FLAGS_FILE, converted_dir, encode_chat, load_tokenizer

TEXTS = ["<think>I need the author.</think>\n<search> war and peace author</search>\n\n<information>Doc 1"
         "(Title: \"War and Peace\") War and Peace is a novel by Leo Tolstoy.</information>",
         "＜search＞ full width, ｆｕｌｌ ｗｉｄｔｈ, é è ß, 日本語, emoji 🙂, tabs\tand\n\nnewlines   spaces",
         "<|im_start|>user\nhi<|im_end|> <|endoftext|> <answer> 42 </answer> SELECT count(*) FROM singer"]


def _same(a, b):
    assert a.backend_tokenizer.to_str() == b.backend_tokenizer.to_str()
    assert a.get_added_vocab() == b.get_added_vocab() and a.special_tokens_map == b.special_tokens_map
    assert a.all_special_ids == b.all_special_ids and a.chat_template == b.chat_template
    for k in ("add_bos_token", "add_eos_token", "_should_update_post_processor", "padding_side", "truncation_side",
              "model_max_length", "split_special_tokens", "clean_up_tokenization_spaces"):
        assert getattr(a, k, None) == getattr(b, k, None), k
    for t in TEXTS:
        assert a.encode(t, add_special_tokens=False) == b.encode(t, add_special_tokens=False), t
        assert a.decode(a.encode(t)) == b.decode(b.encode(t))
    chat = [{"role": "user", "content": TEXTS[0]}]
    assert encode_chat(a, chat) == encode_chat(b, chat)


def test_a_gguf_tokenizer_is_converted_once_and_kept_as_converted(tmp_path, monkeypatch, caplog):
    monkeypatch.setenv("DART_JAX_CACHE", str(tmp_path / "cache"))
    gguf = resolve("smollm2-135m-instruct")
    kept = converted_dir(gguf)
    assert kept.startswith(str(tmp_path / "cache" / "tokenizers")) and not os.path.exists(kept)
    first = load_tokenizer("smollm2-135m-instruct")  # converted, then kept
    assert os.path.isfile(os.path.join(kept, "tokenizer.json"))
    assert [p for p in os.listdir(os.path.dirname(kept)) if ".tmp" in p] == []
    converted = transformers.AutoTokenizer.from_pretrained(os.path.dirname(gguf), gguf_file=os.path.basename(gguf))

    real = transformers.AutoTokenizer.from_pretrained
    calls = []

    def spy(*args, **kw):
        calls.append(kw.get("gguf_file"))
        return real(*args, **kw)

    monkeypatch.setattr(transformers.AutoTokenizer, "from_pretrained", spy)
    second = load_tokenizer("smollm2-135m-instruct")
    assert calls == [None]  # read from the kept copy, not converted
    _same(second, converted)
    _same(first, converted)
    add_sentinel_tokens(second)
    add_sentinel_tokens(converted)
    _same(second, converted)  # the sentinel tags are single ids in both

    # a damaged copy: said, converted again, kept again
    with open(os.path.join(kept, "tokenizer.json"), "w") as f:
        f.write("{not json")
    calls.clear()
    with caplog.at_level(logging.WARNING, logger="dart_jax.tokenization.tokenizer"):
        again = load_tokenizer("smollm2-135m-instruct")
    assert calls == [None, os.path.basename(gguf)] and "does not load" in caplog.text
    _same(again, first)

    # a copy without its flags file (not whole): converted again, and the flags kept with it
    os.remove(os.path.join(kept, FLAGS_FILE))
    calls.clear()
    _same(load_tokenizer("smollm2-135m-instruct"), first)
    assert calls == [os.path.basename(gguf)] and os.path.isfile(os.path.join(kept, FLAGS_FILE))
    assert [p for p in os.listdir(os.path.dirname(kept)) if ".tmp" in p or ".bad" in p] == []

    # another file (a copy: another path and time) is converted into its own copy
    other = tmp_path / "model" / os.path.basename(gguf)
    other.parent.mkdir()
    shutil.copyfile(gguf, other)
    assert converted_dir(str(other)) != kept
    _same(load_tokenizer(str(other)), first)
    assert os.path.isfile(os.path.join(converted_dir(str(other)), "tokenizer.json"))


def test_an_unwritable_cache_still_loads(tmp_path, monkeypatch):
    blocked = tmp_path / "file"
    blocked.write_text("a file where the cache folder would be")
    monkeypatch.setenv("DART_JAX_CACHE", str(blocked))
    tok = load_tokenizer("smollm2-135m-instruct")
    assert tok.encode(TEXTS[2], add_special_tokens=False)
    assert blocked.read_text().startswith("a file")


@pytest.mark.parametrize("env,want", [({"DART_JAX_CACHE": "/x/y"}, "/x/y"), ({}, None)])
def test_cache_root(env, want):
    from dart_jax.data.paths import cache_root
    got = cache_root(env)
    assert got == (want or os.path.join(os.path.expanduser("~"), ".cache", "dart_jax"))
