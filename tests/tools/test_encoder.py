"""JAX BERT encoder vs transformers (mean pooling + L2 norm), tol 1e-4."""

import json
import shutil

import numpy as np
import torch
import transformers

from dart_jax.tools.encoder import Encoder, detect_prefixes

TEXTS = ["who wrote war and peace?", "Leo Tolstoy was a Russian writer.",
         "\"Paris\"\nParis is the capital and most populous city of France, with an estimated population of 2,102,650.",
         "a"]


def reference(path, texts):
    tok = transformers.AutoTokenizer.from_pretrained(path)
    model = transformers.AutoModel.from_pretrained(path).eval()
    enc = tok(texts, padding=True, truncation=True, max_length=256, return_tensors="pt")
    with torch.no_grad():
        h = model(**enc).last_hidden_state
    m = enc["attention_mask"][..., None].float()
    pooled = (h * m).sum(1) / m.sum(1)
    return torch.nn.functional.normalize(pooled, dim=-1).numpy()


def test_minilm_matches_transformers():
    enc = Encoder("all-minilm-l6-v2")
    assert enc.dim == 384 and enc.query_prefix == ""
    ours = enc.encode(TEXTS, batch_size=3)
    np.testing.assert_allclose(ours, reference(enc.path, TEXTS), atol=1e-4)
    np.testing.assert_allclose(np.linalg.norm(ours, axis=1), 1.0, atol=1e-5)
    sims = ours @ ours.T
    assert sims[0, 1] > sims[0, 2]  # the Tolstoy passage is nearer the question


def test_prefixes_from_the_checkpoint(tmp_path):
    """Which file decides: sentence-transformers prompts, then config.json's `_name_or_path`, then the
    directory's name; MiniLM (named by none) gets no prefixes. (A hub-cache snapshot, named only by
    its repository: tests/tools/test_search_r1_index.py.)"""
    minilm = Encoder("all-minilm-l6-v2").path
    assert detect_prefixes(minilm, "all-minilm-l6-v2")[:2] == ("", "")
    plain = tmp_path / "encoder"
    shutil.copytree(minilm, plain)
    assert detect_prefixes(str(plain))[:2] == ("", "")
    config = json.loads((plain / "config.json").read_text())
    (plain / "config.json").write_text(json.dumps({**config, "_name_or_path": "intfloat/e5-base-v2"}))
    assert detect_prefixes(str(plain)) == ("query: ", "passage: ",
                                           "config.json _name_or_path 'intfloat/e5-base-v2' names E5")
    (plain / "config_sentence_transformers.json").write_text(json.dumps(
        {"prompts": {"query": "Represent this question: ", "document": ""}}))
    assert detect_prefixes(str(plain))[:2] == ("Represent this question: ", "")
    named = tmp_path / "e5-base-v2"
    shutil.copytree(minilm, named)
    assert detect_prefixes(str(named))[:2] == ("query: ", "passage: ")
    assert detect_prefixes(str(tmp_path / "bge5"))[:2] == ("", "")


def test_tiny_random_e5_layout_matches_transformers(tmp_path):
    """An E5-style directory (BertModel saved with a `bert.`-free layout, name containing e5):
    prefixes applied, pooled embeddings equal transformers' on the prefixed texts."""
    torch.manual_seed(0)
    cfg = transformers.BertConfig(vocab_size=30522, hidden_size=64, num_hidden_layers=2, num_attention_heads=4,
                                  intermediate_size=128, max_position_embeddings=512)
    path = tmp_path / "tiny-e5-base-v2"
    transformers.BertModel(cfg, add_pooling_layer=False).eval().save_pretrained(path)
    Encoder("all-minilm-l6-v2").tokenizer.save_pretrained(path)
    enc = Encoder(str(path))
    assert (enc.query_prefix, enc.passage_prefix) == ("query: ", "passage: ")
    np.testing.assert_allclose(enc.encode(TEXTS, kind="query"), reference(str(path), ["query: " + t for t in TEXTS]),
                               atol=1e-4)
    np.testing.assert_allclose(enc.encode(TEXTS[:2], kind="passage"),
                               reference(str(path), ["passage: " + t for t in TEXTS[:2]]), atol=1e-4)
