"""Tensor sources: where the base tree's leaves come from, and how each is reshaped.

Every source maps (leaf path, layer) to a named tensor in torch layout plus a `View` that turns it
into our einsum layout by one reshape and one transpose. Keeping the transform a pure view lets
the loader slice a device shard out of an mmap without reading the rest.
"""

from __future__ import annotations

import dataclasses
import glob
import json
import os
from typing import Iterator

import numpy as np

from dart_jax.checkpoints.safetensors_mmap import SafetensorsFile
from dart_jax.models.config import ModelConfig


@dataclasses.dataclass(frozen=True)
class View:
    """target = source.reshape(shape).transpose(perm) (shape None = keep); `raw` is the shape the
    file must hold (torch layout), checked before anything is read."""

    raw: tuple[int, ...]
    shape: tuple[int, ...] | None = None
    perm: tuple[int, ...] | None = None

    def apply_indexed(self, src: np.ndarray, index: tuple[slice, ...]) -> np.ndarray:
        x = src if self.shape is None else src.reshape(self.shape)
        if self.perm is None:
            return x[index]
        inv = [0] * len(self.perm)
        for out_axis, in_axis in enumerate(self.perm):
            inv[in_axis] = out_axis
        src_index = tuple(index[inv[a]] for a in range(len(self.perm)))
        return x[src_index].transpose(self.perm)


def views(cfg: ModelConfig) -> dict[str, View]:
    """Views from torch layout (out, in) to the einsum layout of `param_shapes`, keyed by leaf
    path ('layers/q' is one layer's slice)."""
    D, N, K, H = cfg.hidden_size, cfg.num_heads, cfg.num_kv_heads, cfg.head_dim
    F, V = cfg.intermediate_size, cfg.vocab_size
    return {
        "embed": View((V, D)), "final_norm": View((D,)), "lm_head": View((V, D), perm=(1, 0)),
        "layers/attn_norm": View((D,)), "layers/mlp_norm": View((D,)),
        "layers/q_norm": View((H,)), "layers/k_norm": View((H,)),
        "layers/q": View((N * H, D), (N, H, D), (2, 0, 1)),
        "layers/k": View((K * H, D), (K, H, D), (2, 0, 1)),
        "layers/v": View((K * H, D), (K, H, D), (2, 0, 1)),
        "layers/o": View((D, N * H), (D, N, H), (1, 2, 0)),
        "layers/q_bias": View((N * H,), (N, H)), "layers/k_bias": View((K * H,), (K, H)),
        "layers/v_bias": View((K * H,), (K, H)),
        "layers/gate": View((F, D), perm=(1, 0)), "layers/up": View((F, D), perm=(1, 0)),
        "layers/down": View((D, F), perm=(1, 0)),
    }

HF_TOP = {"embed": "model.embed_tokens.weight", "final_norm": "model.norm.weight",
          "lm_head": "lm_head.weight"}
HF_LAYER = {
    "attn_norm": "input_layernorm.weight", "mlp_norm": "post_attention_layernorm.weight",
    "q": "self_attn.q_proj.weight", "k": "self_attn.k_proj.weight",
    "v": "self_attn.v_proj.weight", "o": "self_attn.o_proj.weight",
    "q_bias": "self_attn.q_proj.bias", "k_bias": "self_attn.k_proj.bias",
    "v_bias": "self_attn.v_proj.bias",
    "q_norm": "self_attn.q_norm.weight", "k_norm": "self_attn.k_norm.weight",
    "gate": "mlp.gate_proj.weight", "up": "mlp.up_proj.weight", "down": "mlp.down_proj.weight",
}
# Tensors some HF checkpoints carry that the model recomputes or shares; safe to ignore.
HF_IGNORABLE_SUFFIXES = ("rotary_emb.inv_freq",)

GGUF_TOP = {"embed": "token_embd.weight", "final_norm": "output_norm.weight",
            "lm_head": "output.weight"}
GGUF_LAYER = {
    "attn_norm": "attn_norm.weight", "mlp_norm": "ffn_norm.weight",
    "q": "attn_q.weight", "k": "attn_k.weight", "v": "attn_v.weight", "o": "attn_output.weight",
    "q_bias": "attn_q.bias", "k_bias": "attn_k.bias", "v_bias": "attn_v.bias",
    "q_norm": "attn_q_norm.weight", "k_norm": "attn_k_norm.weight",
    "gate": "ffn_gate.weight", "up": "ffn_up.weight", "down": "ffn_down.weight",
}


class TensorSource:
    """Base class: `name(path, layer)` and `get(name)`; `names()` lists what the file holds."""

    origin: str

    def name(self, path: str, layer: int | None) -> str:
        raise NotImplementedError

    def get(self, name: str) -> np.ndarray:
        raise NotImplementedError

    def names(self) -> set[str]:
        raise NotImplementedError

    def shape(self, name: str) -> tuple[int, ...]:
        raise NotImplementedError

    def ignorable(self, name: str, cfg: ModelConfig) -> bool:
        return False

    def release(self) -> None:
        """Drop any memoised tensors (called after each leaf is placed)."""


class HFSource(TensorSource):
    """An HF directory: model.safetensors or model.safetensors.index.json + shards."""

    def __init__(self, path: str):
        self.origin = path
        index_path = os.path.join(path, "model.safetensors.index.json")
        single = os.path.join(path, "model.safetensors")
        self._files: dict[str, SafetensorsFile] = {}
        self._where: dict[str, str] = {}
        if os.path.isfile(index_path):
            with open(index_path) as f:
                weight_map = json.load(f)["weight_map"]
            for tensor, fname in weight_map.items():
                fpath = os.path.join(path, fname)
                if fpath not in self._files:
                    if not os.path.isfile(fpath):
                        raise FileNotFoundError(f"{fpath} listed in {index_path} is missing")
                    self._files[fpath] = SafetensorsFile(fpath)
                self._where[tensor] = fpath
        elif os.path.isfile(single):
            self._files[single] = SafetensorsFile(single)
            self._where = {k: single for k in self._files[single].keys()}
        else:
            found = sorted(glob.glob(os.path.join(path, "*.safetensors")))
            raise FileNotFoundError(
                f"{path}: no model.safetensors or model.safetensors.index.json "
                f"(found: {[os.path.basename(p) for p in found] or 'no .safetensors files'})")

    def name(self, path: str, layer: int | None) -> str:
        if layer is None:
            return HF_TOP[path]
        return f"model.layers.{layer}.{HF_LAYER[path]}"

    def names(self) -> set[str]:
        return set(self._where)

    def get(self, name: str) -> np.ndarray:
        return self._files[self._where[name]].get(name)

    def shape(self, name: str) -> tuple[int, ...]:
        return self._files[self._where[name]].shape(name)

    def ignorable(self, name: str, cfg: ModelConfig) -> bool:
        if name.endswith(HF_IGNORABLE_SUFFIXES):
            return True
        return cfg.tie_word_embeddings and name == HF_TOP["lm_head"]


def iter_leaf_names(source: TensorSource, cfg: ModelConfig, leaf_paths) -> Iterator[tuple[str, int | None, str]]:
    for path in leaf_paths:
        if path.startswith("layers/"):
            leaf = path.split("/", 1)[1]
            for layer in range(cfg.num_layers):
                yield path, layer, source.name(leaf, layer)
        else:
            yield path, None, source.name(path, None)
