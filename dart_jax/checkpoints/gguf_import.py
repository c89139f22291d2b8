"""GGUF files (llama.cpp): metadata -> ModelConfig, tensors dequantised with the `gguf` package.

llama.cpp's converter permutes the rows of q and k for the Llama architecture (interleaved RoPE
pairs); `unpermute_qk` undoes it so the weights match the HF `rotate_half` layout.

The file's layout (its scalar metadata, each array's length, and each tensor's type, shape and byte
range: what `gguf.GGUFReader` parses, ~4 s of Python for a 49k-token vocabulary) is kept as a small JSON
under the cache root (`layout_path`, keyed by the file and the `gguf` version) after the first read; later
loads map the tensors from it directly (the same arrays, tested), and re-parse a copy that does not load.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
from importlib.metadata import version

import gguf
import numpy as np

from dart_jax.checkpoints.sources import GGUF_LAYER, GGUF_TOP, TensorSource
from dart_jax.data.paths import cache_root
from dart_jax.models.config import ModelConfig

log = logging.getLogger(__name__)
LAYOUT_VERSION = 1

_ARCH_TO_MODEL_TYPE = {"llama": "llama", "qwen2": "qwen2", "qwen3": "qwen3"}


def unpermute_qk(w: np.ndarray, n_head: int) -> np.ndarray:
    """Inverse of llama.cpp's `permute`: rows grouped (head, pair, 2) -> (head, 2, pair)."""
    rows = w.shape[0]
    half = rows // n_head // 2
    return w.reshape(n_head, half, 2, *w.shape[1:]).swapaxes(1, 2).reshape(w.shape)


def layout_path(path: str) -> str:
    """Where a GGUF file's layout is kept: under the cache root, keyed by the file (path, size, modification
    time) and the `gguf` package's version."""
    real = os.path.realpath(path)
    st = os.stat(real)
    key = f"{real}|{st.st_size}|{st.st_mtime_ns}|{version('gguf')}|{LAYOUT_VERSION}"
    name = os.path.splitext(os.path.basename(real))[0]
    return os.path.join(cache_root(), "gguf", f"{name}-{hashlib.sha1(key.encode()).hexdigest()[:16]}.json")


def _parse_layout(path: str) -> dict:
    """The layout `gguf.GGUFReader` reads: scalar fields, array fields' lengths, and per tensor its ggml
    type, shape (ggml order), data offset, item dtype and count, and the numpy shape of its data."""
    reader = gguf.GGUFReader(path)
    if reader.byte_order != "I":
        raise ValueError(f"{path}: a GGUF of the other byte order")
    fields, lengths = {}, {}
    for key, f in reader.fields.items():
        c = f.contents()
        if isinstance(c, list):
            lengths[key] = len(c)
        elif isinstance(c, (str, int, float, bool)):
            fields[key] = c
    tensors = [{"name": t.name, "type": int(t.tensor_type), "shape": [int(d) for d in t.shape],
                "offset": int(t.data_offset), "dtype": t.data.dtype.str, "count": int(t.data.size),
                "data_shape": [int(d) for d in t.data.shape]} for t in reader.tensors]
    return {"fields": fields, "array_lengths": lengths, "tensors": tensors}


def read_layout(path: str) -> dict:
    """The file's layout, from its kept copy (`layout_path`) or parsed and then kept (written whole or not at
    all; where the cache cannot be written, parsed at every load)."""
    kept = layout_path(path)
    if os.path.isfile(kept):
        try:
            with open(kept) as f:
                layout = json.load(f)
            if layout.get("version") == LAYOUT_VERSION:
                return layout
        except (OSError, ValueError) as e:
            log.warning("GGUF: the kept layout %s does not load (%s): parsing %s again", kept, e, path)
    layout = {"version": LAYOUT_VERSION, **_parse_layout(path)}
    tmp = f"{kept}.tmp{os.getpid()}"
    try:
        os.makedirs(os.path.dirname(kept), exist_ok=True)
        with open(tmp, "w") as f:
            json.dump(layout, f)
        os.replace(tmp, kept)
    except OSError as e:
        log.debug("GGUF: layout not kept in %s (%s)", kept, e)
        if os.path.exists(tmp):
            os.remove(tmp)
    return layout


class _Tensor:
    """One tensor of a GGUF file, as `gguf.GGUFReader` gives it: its ggml type, shape (ggml order) and data
    (a read-only view of the file's bytes)."""

    def __init__(self, mm: np.memmap, t: dict):
        self.name, self.tensor_type, self.shape = t["name"], gguf.GGMLQuantizationType(t["type"]), t["shape"]
        dtype = np.dtype(t["dtype"])
        self.data = mm[t["offset"]:t["offset"] + t["count"] * dtype.itemsize].view(dtype).reshape(t["data_shape"])


class GGUFSource(TensorSource):
    def __init__(self, path: str):
        if not os.path.isfile(path):
            raise FileNotFoundError(f"GGUF file {path} not found")
        self.origin = path
        layout = read_layout(path)
        self._fields, self._lengths = layout["fields"], layout["array_lengths"]
        mm = np.memmap(path, dtype=np.uint8, mode="r")
        self._tensors = {t["name"]: _Tensor(mm, t) for t in layout["tensors"]}
        self._memo: dict[str, np.ndarray] = {}
        self.arch = self.field("general.architecture")
        if self.arch not in _ARCH_TO_MODEL_TYPE:
            raise ValueError(f"{path}: unsupported GGUF architecture {self.arch!r}; "
                             f"supported: {', '.join(_ARCH_TO_MODEL_TYPE)}")
        if "rope_freqs.weight" in self._tensors:
            raise ValueError(f"{path}: GGUF with a rope_freqs tensor (Llama-3.1 scaled RoPE) is not "
                             "supported; load the HF directory instead")

    def field(self, key: str, default=None):
        """A scalar metadata field (str, int, float, bool), or `default`; array fields: `array_length`."""
        return self._fields.get(key, default)

    def array_length(self, key: str) -> int | None:
        return self._lengths.get(key)

    def model_config(self, **overrides) -> ModelConfig:
        a = self.arch

        def need(key):
            v = self.field(f"{a}.{key}")
            if v is None:
                raise ValueError(f"{self.origin}: GGUF metadata is missing {a}.{key}")
            return v

        vocab = self.field(f"{a}.vocab_size") or self.array_length("tokenizer.ggml.tokens") or None
        if vocab is None:
            vocab = int(self._tensors["token_embd.weight"].shape[-1])
        num_heads = int(need("attention.head_count"))
        hidden = int(need("embedding_length"))
        eos = self.field("tokenizer.ggml.eos_token_id")
        kwargs = dict(
            model_type=_ARCH_TO_MODEL_TYPE[a],
            vocab_size=int(vocab),
            hidden_size=hidden,
            intermediate_size=int(need("feed_forward_length")),
            num_layers=int(need("block_count")),
            num_heads=num_heads,
            num_kv_heads=int(self.field(f"{a}.attention.head_count_kv", num_heads)),
            head_dim=int(self.field(f"{a}.attention.key_length", hidden // num_heads)),
            rms_norm_eps=float(need("attention.layer_norm_rms_epsilon")),
            rope_theta=float(self.field(f"{a}.rope.freq_base", 10000.0)),
            tie_word_embeddings="output.weight" not in self._tensors,
            qkv_bias="blk.0.attn_q.bias" in self._tensors,
            qk_norm="blk.0.attn_q_norm.weight" in self._tensors,
            max_position_embeddings=int(self.field(f"{a}.context_length", 8192)),
            bos_token_id=self.field("tokenizer.ggml.bos_token_id"),
            eos_token_ids=() if eos is None else (int(eos),),
        )
        kwargs.update(overrides)
        return ModelConfig(**kwargs)

    def name(self, path: str, layer: int | None) -> str:
        if layer is None:
            return GGUF_TOP[path]
        return f"blk.{layer}.{GGUF_LAYER[path]}"

    def names(self) -> set[str]:
        return set(self._tensors)

    def shape(self, name: str) -> tuple[int, ...]:
        # GGUF stores ggml's (in, out) order; numpy / torch order is reversed.
        return tuple(int(d) for d in reversed(self._tensors[name].shape))

    def get(self, name: str) -> np.ndarray:
        if name not in self._memo:
            t = self._tensors[name]
            w = gguf.quants.dequantize(t.data, t.tensor_type).astype(np.float32)
            w = w.reshape(self.shape(name))
            if self.arch == "llama" and (".attn_q." in name or ".attn_k." in name):
                cfg_heads = int(self.field("llama.attention.head_count"))
                n = cfg_heads if ".attn_q." in name else int(
                    self.field("llama.attention.head_count_kv", cfg_heads))
                w = unpermute_qk(w, n)
            self._memo[name] = w
        return self._memo[name]

    def release(self) -> None:
        self._memo.clear()
