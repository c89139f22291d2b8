"""JAX BERT encoder vs transformers (mean pooling + L2 norm), tol 1e-4."""

import numpy as np
import torch
import transformers

from dart_jax.tools.encoder import Encoder, default_prefixes

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


def test_e5_prefixes_by_name():
    assert default_prefixes("/models/e5-base-v2") == ("query: ", "passage: ")
    assert default_prefixes("/models/all-MiniLM-L6-v2") == ("", "")
