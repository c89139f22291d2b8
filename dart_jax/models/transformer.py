"""The decoder-only transformer (Llama 3.x / SmolLM2 / Qwen2 / Qwen2.5 / Qwen3) as pure functions.

    forward(base, adapters, tokens, positions, route_ids, cache, *, cfg) -> (logits, cache)

`base` is the frozen param tree (see `param_shapes`), weights in einsum layout ('BTD,DNH->BTNH');
`adapters` is None or a dict of LoRA adapters routed per token by `route_ids` (−1 = none), among
which one may supply the block's FFN (models.lora.ffn_adapter: MixLoRA's experts);
`positions` i32[B, T] are RoPE positions with −1 marking padding (left-padded batches); `cache` is
None (plain forward, causal over the given tokens) or a KVCache the new keys are written into.
"""

from __future__ import annotations

import functools
from typing import Any

import jax
import jax.numpy as jnp
from jax.ad_checkpoint import checkpoint_name

from dart_jax.models import cache as cache_lib, dots, lora as lora_lib, rope
from dart_jax.models.attention import (  # noqa: F401  (re-exported: callers import them from here)
    attention,
    attention_mask,
    cached_attention,
    causal_blocked_attention,
    filled_blocks_attention,
    self_attention,
)
from dart_jax.models.cache import KVCache
from dart_jax.models.config import ModelConfig

Params = dict[str, Any]


def param_shapes(cfg: ModelConfig) -> dict[str, tuple[tuple[int, ...], tuple[str | None, ...]]]:
    """Flat map 'path/to/leaf' -> (shape, logical axis names) of the base tree."""
    L, D, F, V = cfg.num_layers, cfg.hidden_size, cfg.intermediate_size, cfg.vocab_size
    N, K, H = cfg.num_heads, cfg.num_kv_heads, cfg.head_dim
    shapes = {
        "embed": ((V, D), ("vocab", "embed")),
        "final_norm": ((D,), ("norm",)),
        "layers/attn_norm": ((L, D), ("layers", "norm")),
        "layers/q": ((L, D, N, H), ("layers", "embed", "heads", "head_dim")),
        "layers/k": ((L, D, K, H), ("layers", "embed", "kv_heads", "head_dim")),
        "layers/v": ((L, D, K, H), ("layers", "embed", "kv_heads", "head_dim")),
        "layers/o": ((L, N, H, D), ("layers", "heads", "head_dim", "embed")),
        "layers/mlp_norm": ((L, D), ("layers", "norm")),
        "layers/gate": ((L, D, F), ("layers", "embed", "mlp")),
        "layers/up": ((L, D, F), ("layers", "embed", "mlp")),
        "layers/down": ((L, F, D), ("layers", "mlp", "embed")),
    }
    if cfg.qkv_bias:
        shapes["layers/q_bias"] = ((L, N, H), ("layers", "heads", "head_dim"))
        shapes["layers/k_bias"] = ((L, K, H), ("layers", "kv_heads", "head_dim"))
        shapes["layers/v_bias"] = ((L, K, H), ("layers", "kv_heads", "head_dim"))
    if cfg.qk_norm:
        shapes["layers/q_norm"] = ((L, H), ("layers", "head_dim"))
        shapes["layers/k_norm"] = ((L, H), ("layers", "head_dim"))
    if not cfg.tie_word_embeddings:
        shapes["lm_head"] = ((D, V), ("embed", "vocab"))
    return shapes


def unflatten(flat: dict[str, Any]) -> Params:
    tree: Params = {}
    for path, value in flat.items():
        node = tree
        *parents, leaf = path.split("/")
        for p in parents:
            node = node.setdefault(p, {})
        node[leaf] = value
    return tree


def flatten(tree: Params, prefix: str = "") -> dict[str, Any]:
    flat = {}
    for key, value in tree.items():
        path = f"{prefix}{key}"
        if isinstance(value, dict):
            flat.update(flatten(value, path + "/"))
        else:
            flat[path] = value
    return flat


def init_params(cfg: ModelConfig, key: jax.Array, std: float = 0.02) -> Params:
    """Random base params (tests, benchmarks). Norm weights are 1, biases small."""
    flat = {}
    shapes = param_shapes(cfg)
    keys = jax.random.split(key, len(shapes))
    for k, (path, (shape, _)) in zip(keys, sorted(shapes.items())):
        if path.endswith("norm"):
            flat[path] = jnp.ones(shape, cfg.weight_dtype)
        else:
            flat[path] = (std * jax.random.normal(k, shape, jnp.float32)).astype(cfg.weight_dtype)
    return unflatten(flat)


def rms_norm(x: jnp.ndarray, weight: jnp.ndarray, eps: float) -> jnp.ndarray:
    """weight · x / sqrt(mean(x²) + eps), statistics in fp32, as transformers' RMSNorm."""
    xf = x.astype(jnp.float32)
    xf = xf * jax.lax.rsqrt(jnp.mean(xf * xf, axis=-1, keepdims=True) + eps)
    return weight.astype(x.dtype) * xf.astype(x.dtype)


def _proj(x, w, spec, layer_adapters, target, route_ids):
    y = dots.einsum(spec, x, w.astype(x.dtype))
    delta = lora_lib.routed_delta(x, layer_adapters, target, route_ids)
    return y if delta is None else y + delta


def _out_proj(attn, w, layer_adapters, route_ids):
    """The output projection with the heads flattened: [B, T, N·H] × [N·H, D], a plain 2-D product.
    Written as "btnh,nhd->btd", XLA:CPU laid the [N, H, D] weight out in [H, N, D] order with a copy on
    every call (in the decode loop: one 576 × 576 copy per layer per token, 4% of SmolLM2's decode)."""
    b, t, n, h = attn.shape
    y = dots.einsum("btf,fd->btd", attn.reshape(b, t, n * h), w.reshape(n * h, w.shape[-1]).astype(attn.dtype))
    delta = lora_lib.routed_delta(attn, layer_adapters, "o", route_ids)
    return y if delta is None else y + delta


def dense_ffn(h, p, layer_adapters, route_ids):
    """The block's own FFN: (silu(h W_gate) ⊙ h W_up) W_down, each projection with its routed LoRA delta."""
    gate = _proj(h, p["gate"], "btd,df->btf", layer_adapters, "gate", route_ids)
    up = _proj(h, p["up"], "btd,df->btf", layer_adapters, "up", route_ids)
    return _proj(jax.nn.silu(gate) * up, p["down"], "btf,fd->btd", layer_adapters, "down", route_ids)


def _layer(cfg: ModelConfig, x, p, layer_adapters, attend, cos, sin, route_ids):
    """One pre-norm block. `attend(q, k, v) -> (attn, aux)` attends the chunk's queries (to the
    chunk itself, or to a KV cache the chunk's keys are written into); returns (x, aux, ffn_stats):
    the FFN is the one an adapter supplies (models.lora.ffn_adapter, e.g. MixLoRA's experts), and
    ffn_stats what it reports (MixLoRA: the gate statistics), else `dense_ffn` and None."""
    h = rms_norm(x, p["attn_norm"], cfg.rms_norm_eps)
    q = _proj(h, p["q"], "btd,dnh->btnh", layer_adapters, "q", route_ids)
    k = _proj(h, p["k"], "btd,dkh->btkh", layer_adapters, "k", route_ids)
    v = _proj(h, p["v"], "btd,dkh->btkh", layer_adapters, "v", route_ids)
    if cfg.qkv_bias:
        q = q + p["q_bias"].astype(q.dtype)
        k = k + p["k_bias"].astype(k.dtype)
        v = v + p["v_bias"].astype(v.dtype)
    if cfg.qk_norm:
        q = rms_norm(q, p["q_norm"], cfg.rms_norm_eps)
        k = rms_norm(k, p["k_norm"], cfg.rms_norm_eps)
    q = rope.apply_rope(q, cos, sin)
    k = rope.apply_rope(k, cos, sin)
    q = checkpoint_name(q, "query_proj")
    k = checkpoint_name(k, "key_proj")
    v = checkpoint_name(v, "value_proj")
    attn, aux = attend(q, k, v)
    attn_out = _out_proj(attn, p["o"], layer_adapters, route_ids)
    x = x + attn_out
    h = rms_norm(x, p["mlp_norm"], cfg.rms_norm_eps)
    ffn = lora_lib.ffn_adapter(layer_adapters)
    if ffn is None:
        return x + dense_ffn(h, p, layer_adapters, route_ids), aux, None
    mlp, stats = ffn.ffn(h, p, route_ids)
    return x + mlp, aux, stats


# "dots" policies also save models.dots' rounded products (bf16 on XLA:CPU: a custom VJP, no dot_general seen)
_REMAT = {
    "full": lambda: jax.checkpoint_policies.nothing_saveable,
    "dots": lambda: jax.checkpoint_policies.save_from_both_policies(
        jax.checkpoint_policies.checkpoint_dots, jax.checkpoint_policies.save_only_these_names(dots.DOTS)),
    "dots_no_batch": lambda: jax.checkpoint_policies.save_from_both_policies(
        jax.checkpoint_policies.dots_with_no_batch_dims_saveable,
        jax.checkpoint_policies.save_only_these_names(dots.DOTS)),
    "save_qkv_proj": lambda: jax.checkpoint_policies.save_only_these_names(
        "query_proj", "key_proj", "value_proj"),
}


def hidden_states(base: Params, adapters, tokens: jnp.ndarray, positions: jnp.ndarray,
                  route_ids: jnp.ndarray | None, cache: KVCache | None, *, cfg: ModelConfig,
                  cache_is_empty: bool = False) -> tuple[jnp.ndarray, KVCache | None]:
    """Final-normed hidden states [B, T, D] (compute dtype) and the updated cache (see
    `hidden_states_and_ffn_stats`, which also returns what an adapter-supplied FFN reports)."""
    h, cache, _ = hidden_states_and_ffn_stats(base, adapters, tokens, positions, route_ids, cache, cfg=cfg,
                                           cache_is_empty=cache_is_empty)
    return h, cache


def hidden_states_and_ffn_stats(base: Params, adapters, tokens: jnp.ndarray, positions: jnp.ndarray,
                                route_ids: jnp.ndarray | None, cache: KVCache | None, *, cfg: ModelConfig,
                                cache_is_empty: bool = False) -> tuple[jnp.ndarray, KVCache | None, dict | None]:
    """Final-normed hidden states [B, T, D] (compute dtype), the updated cache, and the statistics an
    adapter-supplied FFN reports, stacked over layers ({name: [L, ...]}; None with the dense FFN) —
    MixLoRA's gate statistics, the load-balancing loss's input (models.mixlora.load_balancing_loss).
    `cache_is_empty` (static): the cache holds nothing yet (a prefill), so attention skips it and
    only the chunk's keys are written.

    Without a cache (training) the layers run as a `lax.scan` over the stacked weights (or a
    Python loop when `cfg.scan_layers` is False). With a cache (the sampler) they always run as a
    Python loop, layer by layer over the per-layer cache buffers; pass a base from
    `per_layer_params` there, so no weight is sliced out of a stacked array inside the loop
    (static slices of the stacked base are correct but may be copied at every call)."""
    dtype = cfg.dtype
    if route_ids is None:
        route_ids = jnp.full(tokens.shape, -1, jnp.int32)
    x = jnp.take(base["embed"], tokens, axis=0).astype(dtype)
    cos, sin = rope.rope_tables(positions, rope.inverse_frequencies(cfg))
    layer_adapters = lora_lib.layer_slice(adapters)
    self_mask = attention_mask(positions, positions)

    if cache is not None:
        layers = layer_list(base["layers"], cfg.num_layers)
        ads = [_adapters_at(layer_adapters, i) for i in range(cfg.num_layers)]
        if cache_is_empty:  # prefill: attend the chunk only, then write it
            kvs, stats = [], []
            for i in range(cfg.num_layers):
                x, kv, st = _layer(cfg, x, layers[i], ads[i], self_attention(cfg, self_mask), cos, sin,
                                   route_ids)
                kvs.append(kv)
                stats.append(st)
            return (rms_norm(x, base["final_norm"], cfg.rms_norm_eps), cache_lib.write(cache, kvs, positions),
                    _stack(stats))
        w = cache["index"]
        pos = cache_lib.write_pos(cache["pos"], positions, w)
        mask = attention_mask(positions, pos)
        ks, vs, stats = [], [], []
        for i in range(cfg.num_layers):
            attend = cached_attention(cfg, cache["k"][i], cache["v"][i], w, mask)
            x, (kb, vb), st = _layer(cfg, x, layers[i], ads[i], attend, cos, sin, route_ids)
            ks.append(kb)
            vs.append(vb)
            stats.append(st)
        new_cache = KVCache(k=tuple(ks), v=tuple(vs), pos=pos, index=cache_lib.advance(w, positions))
        return rms_norm(x, base["final_norm"], cfg.rms_norm_eps), new_cache, _stack(stats)

    attend = self_attention(cfg, self_mask)
    scan = cfg.scan_layers and not isinstance(base["layers"], (list, tuple))  # a per-layer base runs a loop

    def body(x, xs):
        p, ad = xs
        x, _, st = _layer(cfg, x, p, ad, attend, cos, sin, route_ids)
        return x, st

    if cfg.remat_policy != "none":
        body = jax.checkpoint(body, policy=_REMAT[cfg.remat_policy](), prevent_cse=not scan)

    xs = (base["layers"], layer_adapters)
    if scan:
        x, stats = jax.lax.scan(body, x, xs)
    else:
        layers = layer_list(base["layers"], cfg.num_layers)
        outs = []
        for i in range(cfg.num_layers):
            x, st = body(x, (layers[i], _adapters_at(layer_adapters, i)))
            outs.append(st)
        stats = _stack(outs)
    return rms_norm(x, base["final_norm"], cfg.rms_norm_eps), None, stats


def shared_prefix_hidden_states(base: Params, adapters, prefix: tuple[jnp.ndarray, jnp.ndarray, jnp.ndarray],
                                tokens: jnp.ndarray, positions: jnp.ndarray, route_ids: jnp.ndarray | None, *,
                                cfg: ModelConfig) -> jnp.ndarray:
    """Final-normed hidden states [b, S, D] of b rows that continue one common prefix.

    prefix = (tokens, positions, route_ids) i32[1, P] runs once (position −1 marks padding); each
    row's tokens [b, S] attend the prefix's keys and values and their own, by position (a key is
    visible iff 0 ≤ its position ≤ the query's), layer by layer. Equal to `hidden_states` over the
    b full rows (prefix + continuation) at the continuation's columns, at 1/b of the prefix's cost —
    in the backward pass too, where the prefix's gradient sums the rows' (rl.batch.split_shared_prefix
    builds the inputs). No cache; the layers scan (or loop) and rematerialise as `hidden_states`.
    An adapter-supplied FFN (MixLoRA: its gate statistics would count the prefix once) is not supported."""
    if lora_lib.ffn_adapter(lora_lib.layer_slice(adapters)) is not None:
        raise ValueError("a shared-prefix forward does not support MixLoRA experts: the load-balancing loss "
                         "counts every row's tokens, the shared prefix only once")
    dtype = cfg.dtype
    p_tok, p_pos, p_routes = prefix
    b = tokens.shape[0]
    if route_ids is None:
        route_ids, p_routes = jnp.full(tokens.shape, -1, jnp.int32), jnp.full(p_tok.shape, -1, jnp.int32)
    xp = jnp.take(base["embed"], p_tok, axis=0).astype(dtype)
    xs = jnp.take(base["embed"], tokens, axis=0).astype(dtype)
    inv = rope.inverse_frequencies(cfg)
    cos_p, sin_p = rope.rope_tables(p_pos, inv)
    cos_s, sin_s = rope.rope_tables(positions, inv)
    p_mask = attention_mask(p_pos, p_pos)
    s_mask = attention_mask(positions, jnp.concatenate([jnp.broadcast_to(p_pos, (b, p_pos.shape[1])), positions], 1))
    prefix_attend = self_attention(cfg, p_mask)
    layer_adapters = lora_lib.layer_slice(adapters)

    def body(carry, xs_):
        xp, xs = carry
        p, ad = xs_
        xp, (kp, vp), _ = _layer(cfg, xp, p, ad, prefix_attend, cos_p, sin_p, p_routes)

        def attend(q, k, v):
            full = lambda a, own: jnp.concatenate([jnp.broadcast_to(a, (b,) + a.shape[1:]), own], axis=1)  # noqa: E731
            return attention(q, full(kp, k), full(vp, v), s_mask, cfg), None

        xs, _, _ = _layer(cfg, xs, p, ad, attend, cos_s, sin_s, route_ids)
        return (xp, xs), None

    scan = cfg.scan_layers and not isinstance(base["layers"], (list, tuple))
    if cfg.remat_policy != "none":
        body = jax.checkpoint(body, policy=_REMAT[cfg.remat_policy](), prevent_cse=not scan)
    if scan:
        (_, xs), _ = jax.lax.scan(body, (xp, xs), (base["layers"], layer_adapters))
    else:
        layers = layer_list(base["layers"], cfg.num_layers)
        for i in range(cfg.num_layers):
            (xp, xs), _ = body((xp, xs), (layers[i], _adapters_at(layer_adapters, i)))
    return rms_norm(xs, base["final_norm"], cfg.rms_norm_eps)


def _stack(stats: list) -> dict | None:
    """Per-layer FFN statistics (all None, or all dicts) -> {name: [L, ...]} or None."""
    if not stats or stats[0] is None:
        return None
    return jax.tree.map(lambda *a: jnp.stack(a), *stats)


def _adapters_at(layer_adapters, i: int):
    """Layer i of the layer-stacked adapters (static slice; None passes through)."""
    return None if layer_adapters is None else jax.tree_util.tree_map(lambda a: a[i], layer_adapters)


def layer_list(layers, num_layers: int) -> tuple[Params, ...]:
    """Per-layer param dicts: `layers` itself when already per-layer, else static slices of the
    stacked tree."""
    if isinstance(layers, (list, tuple)):
        if len(layers) != num_layers:
            raise ValueError(f"base has {len(layers)} per-layer param dicts, the config {num_layers} layers")
        return tuple(layers)
    return tuple(jax.tree_util.tree_map(lambda a, i=i: a[i], layers) for i in range(num_layers))


_PER_LAYER: dict = {}


def per_layer_params(base: Params) -> Params:
    """The base with `layers` as a tuple of per-layer dicts, each weight its own buffer: the layout
    the sampler's unrolled layer loop reads without slicing (on XLA:CPU a weight sliced out of the
    stacked [L, …] array inside the decode loop is copied at every step: 19 ms of a 78 ms SmolLM2
    step at batch 32). With tied embeddings it also stores the output head as a [D, V] copy
    ("head"): the decode head reads it ~8% faster in fp32 and ~8× faster in bf16 than the
    transposed embedding. Costs one copy of the layer weights (+ the head), each placed as its
    source on the mesh (so 1/n of it per device on an n-way sharded base; rollout.placement's
    `stacked` decode layout keeps no copy); the last conversion
    is memoised on the identity of the source arrays, so a frozen base (DART, LoRA) is converted
    once per process and a changed one (full fine-tuning, trained tag rows) again."""
    layers = base["layers"]
    if isinstance(layers, (list, tuple)):
        return base
    leaves = tuple(jax.tree_util.tree_leaves(layers)) + (base["embed"],)
    key = tuple(id(a) for a in leaves)
    hit = _PER_LAYER.get("entry")
    if hit is not None and hit[0] == key:
        return dict(base, layers=hit[2], **hit[3])
    split, head = _split_layers(layers, base["embed"], "lm_head" not in base)
    extra = {} if head is None else {"head": head}  # tied: a [D, V] copy, the layout the decode head reads fastest
    _PER_LAYER["entry"] = (key, leaves, split, extra)  # holding `leaves` keeps their ids from being reused
    return dict(base, layers=split, **extra)


def _drop_leading(sharding: jax.sharding.NamedSharding) -> jax.sharding.NamedSharding:
    """The sharding of a[i] for a stacked leaf a placed by `sharding` (the layer axis is never
    sharded: DEFAULT_RULES' "layers" is None)."""
    return jax.sharding.NamedSharding(sharding.mesh, jax.sharding.PartitionSpec(*tuple(sharding.spec)[1:]))


def _transposed(sharding: jax.sharding.NamedSharding) -> jax.sharding.NamedSharding:
    spec = tuple(sharding.spec) + (None,) * (2 - len(sharding.spec))
    return jax.sharding.NamedSharding(sharding.mesh, jax.sharding.PartitionSpec(spec[1], spec[0]))


@functools.lru_cache(maxsize=8)
def _splitter(n: int, tied: bool, treedef, layer_sh: tuple, embed_sh):
    out_sh = (tuple(jax.tree_util.tree_unflatten(treedef, [_drop_leading(s) for s in layer_sh]) for _ in range(n)),
              _transposed(embed_sh) if tied else None)

    def split(layers, embed):
        return (tuple(jax.tree_util.tree_map(lambda a, i=i: a[i], layers) for i in range(n)),
                embed.T if tied else None)
    return jax.jit(split, out_shardings=out_sh)


def _split_layers(layers, embed, tied: bool):
    """Per-layer copies of the stacked weights (and the [D, V] head when tied). On a mesh each copy
    is placed as its source minus the layer axis, so every device copies only its own shards."""
    leaves, treedef = jax.tree_util.tree_flatten(layers)
    n = leaves[0].shape[0]
    named = jax.sharding.NamedSharding
    if all(isinstance(getattr(a, "sharding", None), named) for a in leaves + [embed]):
        return _splitter(n, tied, treedef, tuple(a.sharding for a in leaves), embed.sharding)(layers, embed)
    return (tuple(jax.tree_util.tree_map(lambda a, i=i: a[i], layers) for i in range(n)),
            jnp.array(embed.T) if tied else None)


def unstack_layers(base: Params) -> Params:
    """The base with `layers` as per-layer dicts and no other copy (no [D, V] head): for a run that
    holds its frozen base in the decode layout itself (rollout decode_layout "shared"), so training
    (a Python loop over the layers instead of a scan) and rollouts read one tree. Each piece is
    placed as its source; the stacked arrays are freed when the caller drops them."""
    layers = base["layers"]
    if isinstance(layers, (list, tuple)):
        return base
    split, _ = _split_layers(layers, base["embed"], False)
    return dict(base, layers=split)


def clear_decode_layout() -> None:
    """Drop the memoised per-layer copy (`per_layer_params`), e.g. before the source base is freed."""
    _PER_LAYER.clear()


def output_head(base: Params, cfg: ModelConfig) -> jnp.ndarray:
    """[D, V] output projection (the embedding transposed when tied, unless `per_layer_params`
    stored the transposed copy as "head")."""
    if "head" in base:
        return base["head"]
    return base["embed"].T if cfg.tie_word_embeddings else base["lm_head"]


def forward(base: Params, adapters, tokens: jnp.ndarray, positions: jnp.ndarray,
            route_ids: jnp.ndarray | None, cache: KVCache | None, *, cfg: ModelConfig
            ) -> tuple[jnp.ndarray, KVCache | None]:
    """tokens, positions, route_ids: i32[B, T] -> logits f32[B, T, V], updated cache."""
    x, cache = hidden_states(base, adapters, tokens, positions, route_ids, cache, cfg=cfg)
    logits = dots.einsum("btd,dv->btv", x, output_head(base, cfg).astype(x.dtype))
    return logits.astype(jnp.float32), cache
