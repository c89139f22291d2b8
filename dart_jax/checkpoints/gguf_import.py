"""GGUF files (llama.cpp): metadata -> ModelConfig, tensors dequantised with the `gguf` package.

llama.cpp's converter permutes the rows of q and k for the Llama architecture (interleaved RoPE
pairs); `unpermute_qk` undoes it so the weights match the HF `rotate_half` layout.

The file's layout (its scalar metadata, each array's length, and each tensor's type, shape and byte
range: what `gguf.GGUFReader` parses, ~4 s of Python for a 49k-token vocabulary) is kept as a small JSON
under the cache root (`layout_path`, keyed by the file and the `gguf` version) after the first read; later
loads map the tensors from it directly (the same arrays, tested), and parse again where a kept layout does
not load or does not fit the file.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import tempfile
from importlib.metadata import version

import gguf
import numpy as np

from dart_jax.checkpoints.sources import GGUF_LAYER, GGUF_TOP, TensorSource
from dart_jax.data.paths import cache_root, file_key
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
    """Where a GGUF file's layout is kept: under the cache root, keyed by the file (`file_key`) and the `gguf`
    package's version."""
    key = f"{file_key(path)}|{version('gguf')}|{LAYOUT_VERSION}"
    name = os.path.splitext(os.path.basename(os.path.realpath(path)))[0]
    return os.path.join(cache_root(), "gguf", f"{name}-{hashlib.sha1(key.encode()).hexdigest()[:16]}.json")


def _fields(reader) -> tuple[dict, dict]:
    """(scalar fields, array fields' lengths) of a `gguf.GGUFReader`."""
    fields, lengths = {}, {}
    for key, f in reader.fields.items():
        c = f.contents()
        if isinstance(c, list):
            lengths[key] = len(c)
        elif isinstance(c, (str, int, float, bool)):
            fields[key] = c
    return fields, lengths


def _layout(reader) -> dict:
    """The layout `gguf.GGUFReader` read: scalar fields, array fields' lengths, and per tensor its ggml type,
    shape (ggml order), data offset, item dtype and count, and the numpy shape of its data."""
    fields, lengths = _fields(reader)
    tensors = [{"name": t.name, "type": int(t.tensor_type), "shape": [int(d) for d in t.shape],
                "offset": int(t.data_offset), "dtype": t.data.dtype.str, "count": int(t.data.size),
                "data_shape": [int(d) for d in t.data.shape]} for t in reader.tensors]
    return {"version": LAYOUT_VERSION, "fields": fields, "array_lengths": lengths, "tensors": tensors}


def _keep(kept: str, layout: dict) -> None:
    """Write the layout whole or not at all (a temporary file renamed into place); not at all where the cache
    cannot be written."""
    tmp = None
    try:
        os.makedirs(os.path.dirname(kept), exist_ok=True)
        fd, tmp = tempfile.mkstemp(dir=os.path.dirname(kept), prefix=os.path.basename(kept) + ".tmp")
        with os.fdopen(fd, "w") as f:
            json.dump(layout, f)
        os.replace(tmp, kept)
        tmp = None
    except OSError as e:
        log.debug("GGUF: layout not kept in %s (%s)", kept, e)
    finally:
        if tmp is not None and os.path.exists(tmp):
            os.remove(tmp)


class _Tensor:
    """One tensor of a GGUF file, as `gguf.GGUFReader` gives it: its ggml type, shape (ggml order) and data
    (a read-only view of the file's bytes)."""

    def __init__(self, mm: np.memmap, t: dict):
        self.name, self.tensor_type, self.shape = t["name"], gguf.GGMLQuantizationType(t["type"]), t["shape"]
        dtype = np.dtype(t["dtype"])
        self.data = mm[t["offset"]:t["offset"] + t["count"] * dtype.itemsize].view(dtype).reshape(t["data_shape"])


def _mapped(path: str, layout: dict) -> tuple[dict, dict, dict]:
    """(fields, array lengths, {name: tensor}) from a kept layout; raises where it does not fit the file."""
    mm = np.memmap(path, dtype=np.uint8, mode="r")
    if layout.get("version") != LAYOUT_VERSION:
        raise ValueError(f"layout version {layout.get('version')!r}")
    tensors = {t["name"]: _Tensor(mm, t) for t in layout["tensors"]}
    return dict(layout["fields"]), dict(layout["array_lengths"]), tensors


def read_tensors(path: str) -> tuple[dict, dict, dict]:
    """(scalar fields, array lengths, {name: tensor}) of a GGUF file: mapped from its kept layout
    (`layout_path`), else parsed with `gguf.GGUFReader` and the layout kept (a file of the other byte order
    is parsed every time: its views are the reader's own)."""
    kept = layout_path(path)
    if os.path.isfile(kept):
        try:
            with open(kept) as f:
                return _mapped(path, json.load(f))
        except (OSError, ValueError, KeyError, TypeError) as e:
            log.warning("GGUF: the kept layout %s does not load (%s): parsing %s again", kept, e, path)
    reader = gguf.GGUFReader(path)
    if reader.byte_order == "I":
        _keep(kept, _layout(reader))
    return (*_fields(reader), {t.name: t for t in reader.tensors})


class GGUFSource(TensorSource):
    def __init__(self, path: str):
        if not os.path.isfile(path):
            raise FileNotFoundError(f"GGUF file {path} not found")
        self.origin = path
        self._fields, self._lengths, self._tensors = read_tensors(path)
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
