"""DART adapter directories: init -> export -> import round trip, and the routed crosscheck on a
tiny untied Llama that uses the real SmolLM2 tokenizer (so the tags are real added tokens)."""

import json
import os

import numpy as np
import pytest

import tiny_models
from dart_jax.adapters.bootstrap import init_dart_directory
from dart_jax.checkpoints.dart_io import import_dart
from dart_jax.checkpoints.registry import load_model
from dart_jax.parity.adapters_check import crosscheck_adapters
from dart_jax.tokenization.tokenizer import load_tokenizer


@pytest.fixture(scope="module")
def tiny_with_tokenizer(tmp_path_factory):
    path = str(tmp_path_factory.mktemp("tiny_llama_tok"))
    tiny_models.build("llama", path, vocab_size=49152, bos_token_id=1, eos_token_id=2, pad_token_id=2)
    load_tokenizer("smollm2-135m-instruct").save_pretrained(path)
    return path


def test_round_trip_and_router_ids(tiny_with_tokenizer, tmp_path):
    out = init_dart_directory(tiny_with_tokenizer, str(tmp_path / "dart"), seed=3, b_std=0.05)
    manifest = json.load(open(os.path.join(out, "dart_adapters.json")))
    assert manifest["adapters"] == ["reasoning", "tool"] and manifest["vocab_size"] == 49160
    for name in ("reasoning", "tool"):
        assert os.path.isfile(os.path.join(out, name, "adapter_model.safetensors"))
    cfg, base = load_model(tiny_with_tokenizer)
    adapters, spec, base2, cfg2, tok = import_dart(out, base, cfg)
    assert cfg2.vocab_size == 49160 and base2["embed"].shape[0] == 49160 and base2["lm_head"].shape[1] == 49160
    assert spec.open_ids == (tok.convert_tokens_to_ids("<search>"),) and spec.close_ids == (49153,)
    assert adapters["tool"].scale == 2.0 and adapters["tool"].rank == 8
    assert float(np.abs(np.asarray(adapters["tool"].params["q"]["b"])).max()) > 0
    np.testing.assert_array_equal(np.asarray(base2["embed"][:49152]), np.asarray(base["embed"]))


def test_routed_crosscheck_on_tiny_model(tiny_with_tokenizer, tmp_path):
    out = init_dart_directory(tiny_with_tokenizer, str(tmp_path / "dart"), seed=4, b_std=0.05)
    rep = crosscheck_adapters(tiny_with_tokenizer, out)
    assert rep.tokens_per_route["tool"] > 10 and rep.tokens_per_route["reasoning"] > 50
    assert rep.max_abs_logit_diff <= 1e-4, rep
    assert rep.max_abs_grad_diff <= 1e-5 + 1e-5 * rep.max_abs_grad, rep
