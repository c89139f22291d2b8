"""Shardings of the model's trees (base params, KV cache, token batches) from logical rules."""

from __future__ import annotations

from jax.sharding import Mesh, NamedSharding, PartitionSpec

from dart_jax.models.config import ModelConfig
from dart_jax.models.transformer import param_shapes, unflatten
from dart_jax.parallel.mesh import DEFAULT_RULES, LogicalRules, named_sharding, tree_shardings


def base_shardings_flat(cfg: ModelConfig, mesh: Mesh, rules: LogicalRules = DEFAULT_RULES
                        ) -> dict[str, NamedSharding]:
    return tree_shardings(param_shapes(cfg), mesh, rules)


def base_shardings(cfg: ModelConfig, mesh: Mesh, rules: LogicalRules = DEFAULT_RULES) -> dict:
    return unflatten(base_shardings_flat(cfg, mesh, rules))


def batch_sharding(shape, mesh: Mesh, rules: LogicalRules = DEFAULT_RULES) -> NamedSharding:
    """i32[B, T] tokens / positions / routes: batch over data × fsdp."""
    return named_sharding(("batch", "length"), shape, mesh, rules)


def logits_sharding(shape, mesh: Mesh, rules: LogicalRules = DEFAULT_RULES) -> NamedSharding:
    return named_sharding(("batch", "length", "vocab"), shape, mesh, rules)


def sharded_forward(cfg: ModelConfig, mesh: Mesh, batch_shape: tuple[int, int],
                    rules: LogicalRules = DEFAULT_RULES):
    """The plain forward (no adapters, no cache) jitted with explicit in/out shardings:
    (base, tokens, positions) -> logits f32[B, T, V]."""
    import jax

    from dart_jax.models.transformer import forward

    tok = batch_sharding(batch_shape, mesh, rules)
    out = logits_sharding(batch_shape + (cfg.vocab_size,), mesh, rules)

    def fn(base, tokens, positions):
        logits, _ = forward(base, None, tokens, positions, None, None, cfg=cfg)
        return logits

    return jax.jit(fn, in_shardings=(base_shardings(cfg, mesh, rules), tok, tok), out_shardings=out)


def adapter_shardings(adapters, cfg: ModelConfig, mesh: Mesh, rules: LogicalRules = DEFAULT_RULES):
    """The adapters' tree (dict name -> LoraAdapter | MixLoraExperts) with a NamedSharding at every
    leaf: A follows the projection's input dims, B its output dims, the rank axis is replicated."""
    from dart_jax.models.lora import lora_logical_shapes
    from dart_jax.models.mixlora import MixLoraExperts, logical_shapes

    out = {}
    for name, ad in adapters.items():
        if isinstance(ad, MixLoraExperts):  # router and experts: the FFN dims as the base's
            flat = tree_shardings(logical_shapes(ad), mesh, rules)
            out[name] = ad.replace(params={"router": flat["router"],
                                           **{t: {"a": flat[f"{t}/a"], "b": flat[f"{t}/b"]}
                                              for t in ad.params if t != "router"}})
            continue
        logical = lora_logical_shapes(cfg, ad.rank, tuple(ad.params))
        flat = tree_shardings(logical, mesh, rules)
        params = {t: {"a": flat[f"{t}/a"], "b": flat[f"{t}/b"]} for t in ad.params}
        key = None if ad.dropout_key is None else NamedSharding(mesh, PartitionSpec())
        out[name] = ad.replace(params=params, dropout_key=key)
    return out
