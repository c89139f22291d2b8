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
