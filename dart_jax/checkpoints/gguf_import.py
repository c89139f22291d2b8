"""GGUF files (llama.cpp): metadata -> ModelConfig, tensors dequantised with the `gguf` package.

llama.cpp's converter permutes the rows of q and k for the Llama architecture (interleaved RoPE
pairs); `unpermute_qk` undoes it so the weights match the HF `rotate_half` layout.
"""

from __future__ import annotations

import os

import gguf
import numpy as np

from dart_jax.checkpoints.sources import GGUF_LAYER, GGUF_TOP, TensorSource
from dart_jax.models.config import ModelConfig

_ARCH_TO_MODEL_TYPE = {"llama": "llama", "qwen2": "qwen2", "qwen3": "qwen3"}


def unpermute_qk(w: np.ndarray, n_head: int) -> np.ndarray:
    """Inverse of llama.cpp's `permute`: rows grouped (head, pair, 2) -> (head, 2, pair)."""
    rows = w.shape[0]
    half = rows // n_head // 2
    return w.reshape(n_head, half, 2, *w.shape[1:]).swapaxes(1, 2).reshape(w.shape)


class GGUFSource(TensorSource):
    def __init__(self, path: str):
        if not os.path.isfile(path):
            raise FileNotFoundError(f"GGUF file {path} not found")
        self.origin = path
        self.reader = gguf.GGUFReader(path)
        self._tensors = {t.name: t for t in self.reader.tensors}
        self._memo: dict[str, np.ndarray] = {}
        self.arch = self.field("general.architecture")
        if self.arch not in _ARCH_TO_MODEL_TYPE:
            raise ValueError(f"{path}: unsupported GGUF architecture {self.arch!r}; "
                             f"supported: {', '.join(_ARCH_TO_MODEL_TYPE)}")
        if "rope_freqs.weight" in self._tensors:
            raise ValueError(f"{path}: GGUF with a rope_freqs tensor (Llama-3.1 scaled RoPE) is not "
                             "supported; load the HF directory instead")

    def field(self, key: str, default=None):
        f = self.reader.fields.get(key)
        return default if f is None else f.contents()

    def model_config(self, **overrides) -> ModelConfig:
        a = self.arch

        def need(key):
            v = self.field(f"{a}.{key}")
            if v is None:
                raise ValueError(f"{self.origin}: GGUF metadata is missing {a}.{key}")
            return v

        tokens = self.field("tokenizer.ggml.tokens")
        vocab = self.field(f"{a}.vocab_size") or (len(tokens) if tokens else None)
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
