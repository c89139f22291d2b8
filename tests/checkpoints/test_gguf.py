"""The embedded SmolLM2-135M-Instruct GGUF vs transformers' own GGUF loader."""

import numpy as np

from dart_jax.checkpoints.gguf_import import unpermute_qk
from dart_jax.parity.model_check import crosscheck_model


def llama_cpp_permute(w, n_head):
    """llama.cpp convert_hf_to_gguf.py `permute` (the forward direction)."""
    return w.reshape(n_head, 2, w.shape[0] // n_head // 2, *w.shape[1:]).swapaxes(1, 2).reshape(w.shape)


def test_unpermute_inverts_llama_cpp_permute():
    w = np.arange(6 * 4 * 5, dtype=np.float32).reshape(24, 5)
    for heads in (1, 2, 3, 6):
        if 24 % (2 * heads) == 0:
            np.testing.assert_array_equal(unpermute_qk(llama_cpp_permute(w, heads), heads), w)


def test_config_from_gguf_metadata(smollm2):
    cfg, base, _ = smollm2
    assert ((cfg.model_type, cfg.num_layers, cfg.hidden_size, cfg.num_heads, cfg.num_kv_heads)
            == ("llama", 30, 576, 9, 3))
    assert cfg.tie_word_embeddings and "lm_head" not in base
    assert cfg.rope_theta == 100000.0 and cfg.vocab_size == 49152


def test_smollm2_logits_and_greedy_match_transformers():
    report = crosscheck_model("smollm2-135m-instruct", max_new_tokens=32)
    assert report.max_abs_logit_diff <= 1e-3, report
    assert report.max_abs_logprob_diff <= 1e-3, report
    assert report.greedy_agree == report.greedy_tokens == 32 * report.num_prompts, report


def test_the_kept_layout_maps_the_tensors_gguf_reads(tmp_path, monkeypatch, caplog):
    """GGUFSource reads the file's layout once with gguf.GGUFReader and keeps it under the cache root; a later
    source maps every tensor from the kept copy without parsing: the same ggml type, shape and data (bitwise)
    as the reader's, the same config; a damaged copy is parsed again."""
    import json
    import logging
    import os

    import gguf

    from dart_jax.checkpoints import gguf_import
    from dart_jax.models.names import resolve
    monkeypatch.setenv("DART_JAX_CACHE", str(tmp_path))
    path = resolve("smollm2-135m-instruct")
    kept = gguf_import.layout_path(path)
    assert kept.startswith(str(tmp_path)) and not os.path.exists(kept)
    parsed = []
    real = gguf.GGUFReader
    monkeypatch.setattr(gguf, "GGUFReader", lambda p: parsed.append(p) or real(p))
    first = gguf_import.GGUFSource(path)
    assert parsed == [path] and os.path.isfile(kept)
    second = gguf_import.GGUFSource(path)
    assert parsed == [path]  # mapped from the kept layout
    reader = real(path)
    assert len(second._tensors) == len(reader.tensors) == 272
    for t in reader.tensors:
        mine = second._tensors[t.name]
        assert mine.tensor_type == t.tensor_type and list(mine.shape) == t.shape.tolist()
        assert mine.data.dtype == t.data.dtype and mine.data.shape == t.data.shape
        np.testing.assert_array_equal(mine.data, t.data)
    assert second.model_config() == first.model_config()
    assert second.field("general.architecture") == "llama" and second.array_length("tokenizer.ggml.tokens") == 49152
    np.testing.assert_array_equal(second.get("blk.0.attn_k.weight"), first.get("blk.0.attn_k.weight"))
    layout = json.load(open(kept))
    with open(kept, "w") as f:
        f.write('{"version": 1, "fields"')  # cut short
    with caplog.at_level(logging.WARNING, logger="dart_jax.checkpoints.gguf_import"):
        again = gguf_import.GGUFSource(path)
    assert parsed == [path, path] and "does not load" in caplog.text
    assert again.model_config() == first.model_config() and json.load(open(kept)) == layout  # kept again
    layout["tensors"][-1]["offset"] = os.path.getsize(path)  # whole JSON, but past the file's end
    with open(kept, "w") as f:
        json.dump(layout, f)
    gguf_import.GGUFSource(path)
    assert parsed == [path, path, path]
    assert [p for p in os.listdir(os.path.dirname(kept)) if ".tmp" in p] == []
