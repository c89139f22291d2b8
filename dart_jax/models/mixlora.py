"""MixLoRA (the MixLoRA paper's method, as MoE-PEFT's `mixlora` implements it): LoRA experts in the
FFN mixed by a learned top-k gate (MoE-PEFT's "router"; here "gate", to keep it apart from the role
router ψ of roles.router), one plain LoRA on each attention projection.

Per layer, for the FFN input x [B, T, D] (after the MLP norm):

    z = x W_r                     (fp32; W_r [D, E], bias-free, init N(0, 0.02²); params["router"])
    p = softmax(z);  top-k of p;  the k weights renormalised to sum to 1 → w [B, T, E] (0 elsewhere)
    g_e = x W_gate + s·(x A^gate_e) B^gate_e,   u_e = x W_up + s·(x A^up_e) B^up_e
    h_e = silu(g_e) ⊙ u_e,   y_e = h_e W_down + s·(h_e A^down_e) B^down_e
    FFN(x) = Σ_e w_e · y_e        (accumulated in fp32, as MoE-PEFT, then the compute dtype)

The frozen FFN weights are shared by the experts and the base gate / up projections are computed
once (MoE-PEFT's `_mixlora_forward`); each expert then runs its own down projection on its own h_e.
Every expert is evaluated on every token and the unselected ones weighted 0 (exact; with the
paper's E = 2, top-2 every expert is selected anyway; E = 8, top-2 spends 4× the expert FLOPs
of a gather-based dispatch — fine at this project's scale, the place to change for large E). An
expert's weight is 0 on a token it was not selected for, so its LoRA gets no gradient from it.

Load balancing (Mixtral's form, MoE-PEFT's `_mixtral_load_balancing_loss_func`) over the gate
outputs of all layers and all real tokens:

    aux = coef · E · Σ_{k,e} f[k, e] · P[e],
    f[k, e] = share of (layer, token) pairs whose k-th choice is expert e,  P[e] = mean p_e

Only P carries a gradient (the top-k choice does not). Each layer reports sums (`gate_stats`), so
the loss needs no [L, B, T, E] tensor.

The experts plug into the transformer block as its FFN (`MixLoraExperts.ffn`, the FFN-adapter hook
of models.lora.ffn_adapter); the block returns what that FFN reports, the per-layer gate statistics.
"""

from __future__ import annotations

import math

import flax.struct
import jax
import jax.numpy as jnp

from dart_jax.models import dots
from dart_jax.models.config import ModelConfig

FFN = ("gate", "up", "down")
GATE_INIT_STD = 0.02  # MoE-PEFT's router_init_range


@flax.struct.dataclass
class MixLoraExperts:
    """params: "router" [L, D, E] (fp32: the expert gate W_r; the key is the stored layout's) and, per
    FFN target, {"a": [L, E, *in, r], "b": [L, E, r, *out]}; scale s = alpha / r (every expert),
    top_k static."""

    params: dict
    scale: float = flax.struct.field(pytree_node=False, default=1.0)
    top_k: int = flax.struct.field(pytree_node=False, default=2)

    @property
    def num_experts(self) -> int:
        return int(self.params["router"].shape[-1])

    @property
    def rank(self) -> int:
        return int(self.params["gate"]["a"].shape[-1])

    def ffn(self, x: jnp.ndarray, p: dict, route_ids: jnp.ndarray) -> tuple[jnp.ndarray, dict]:
        """The FFN-adapter hook (models.lora.ffn_adapter): this layer's MixLoRA FFN in place of the
        dense one, with its gate statistics over the real tokens (route id ≥ 0): `moe_ffn`."""
        return moe_ffn(x, p, self, route_ids >= 0)


def init_experts(cfg: ModelConfig, key: jax.Array, num_experts: int, top_k: int, rank: int, alpha: float,
                 init: str = "normal", init_std: float = 0.02, dtype=jnp.float32, rslora: bool = False
                 ) -> MixLoraExperts:
    """Gate ~ N(0, 0.02²) in fp32; each expert's A as LoRA's `init` (N(0, init_std²) or PEFT's
    kaiming-uniform), B = 0 — so the layer starts as the frozen FFN."""
    if not 1 <= top_k <= num_experts:
        raise ValueError(f"MixLoRA top_k = {top_k} with {num_experts} experts; expected 1 ≤ top_k ≤ experts")
    if rank <= 0:
        raise ValueError(f"MixLoRA expert rank must be positive, got {rank}")
    L, D, F = cfg.num_layers, cfg.hidden_size, cfg.intermediate_size
    dims = {"gate": (D, F), "up": (D, F), "down": (F, D)}
    params = {"router": GATE_INIT_STD * jax.random.normal(jax.random.fold_in(key, 99), (L, D, num_experts),
                                                             jnp.float32)}
    for i, t in enumerate(FFN):
        d_in, d_out = dims[t]
        k = jax.random.fold_in(key, i)
        shape = (L, num_experts, d_in, rank)
        if init == "normal":
            a = init_std * jax.random.normal(k, shape, jnp.float32)
        elif init == "kaiming_uniform":
            bound = 1.0 / math.sqrt(d_in)
            a = jax.random.uniform(k, shape, jnp.float32, -bound, bound)
        else:
            raise ValueError(f"LoRA init {init!r}; expected 'normal' or 'kaiming_uniform'")
        params[t] = {"a": a.astype(dtype), "b": jnp.zeros((L, num_experts, rank, d_out), dtype)}
    return MixLoraExperts(params=params, scale=alpha / math.sqrt(rank) if rslora else alpha / rank, top_k=top_k)


def logical_shapes(experts: MixLoraExperts) -> dict[str, tuple[tuple[int, ...], tuple[str, ...]]]:
    """Flat 'router' / 'target/a' / 'target/b' -> (shape, logical axes): the expert axis replicated,
    the FFN dims sharded as the base's, the rank replicated (as a LoRA's)."""
    out = {"router": (tuple(experts.params["router"].shape), ("layers", "embed", "experts"))}
    for t in FFN:
        d_in, d_out = {"gate": ("embed", "mlp"), "up": ("embed", "mlp"), "down": ("mlp", "embed")}[t]
        out[f"{t}/a"] = (tuple(experts.params[t]["a"].shape), ("layers", "experts", d_in, "lora_rank"))
        out[f"{t}/b"] = (tuple(experts.params[t]["b"].shape), ("layers", "experts", "lora_rank", d_out))
    return out


def gating(x: jnp.ndarray, gate: jnp.ndarray, top_k: int) -> tuple[jnp.ndarray, jnp.ndarray, jnp.ndarray]:
    """x [..., D], gate [D, E] -> (probs f32[..., E], selected i32[..., k], weights f32[..., E]): the
    softmax of the fp32 gate logits, the top-k experts (ties: the lower index first) and their
    probabilities renormalised to sum to 1, scattered to [..., E] (0 for unselected experts)."""
    logits = jnp.einsum("...d,de->...e", x.astype(jnp.float32), gate.astype(jnp.float32))
    probs = jax.nn.softmax(logits, axis=-1)
    top, selected = jax.lax.top_k(probs, top_k)
    top = top / jnp.sum(top, axis=-1, keepdims=True)
    onehot = jax.nn.one_hot(selected, probs.shape[-1], dtype=jnp.float32)     # [..., k, E]
    return probs, selected, jnp.einsum("...k,...ke->...e", top, onehot)


def moe_ffn(x: jnp.ndarray, p: dict, experts: MixLoraExperts, real: jnp.ndarray | None
            ) -> tuple[jnp.ndarray, dict]:
    """The MixLoRA FFN of one layer. x [B, T, D] (compute dtype); p the layer's base weights; experts
    this layer's slice (params without the layer axis); real bool[B, T] (tokens the load-balancing
    statistics count; None: all). -> (FFN output [B, T, D], `gate_stats` sums of this layer)."""
    ep, s, dt = experts.params, experts.scale, x.dtype
    probs, selected, weights = gating(x, ep["router"], experts.top_k)

    def delta(inp, t, spec_a, spec_b):
        h = dots.einsum(spec_a, inp, ep[t]["a"].astype(dt))
        return dots.einsum(spec_b, h, ep[t]["b"].astype(dt)) * jnp.asarray(s, dt)

    g = dots.einsum("btd,df->btf", x, p["gate"].astype(dt))[:, :, None] + delta(x, "gate", "btd,edr->bter",
                                                                               "bter,erf->btef")
    u = dots.einsum("btd,df->btf", x, p["up"].astype(dt))[:, :, None] + delta(x, "up", "btd,edr->bter",
                                                                             "bter,erf->btef")
    h = jax.nn.silu(g) * u                                                                  # [B, T, E, F]
    y = dots.einsum("btef,fd->bted", h, p["down"].astype(dt)) + delta(h, "down", "btef,efr->bter",
                                                                      "bter,erd->bted")
    out = jnp.einsum("bted,bte->btd", y.astype(jnp.float32), weights).astype(dt)
    return out, gate_stats(probs, selected, real)


def gate_stats(probs: jnp.ndarray, selected: jnp.ndarray, real: jnp.ndarray | None) -> dict:
    """Sums over the real tokens of one layer: "choice" f32[k, E] (how often the k-th choice is e),
    "prob" f32[E] (Σ p_e, differentiable), "tokens" f32 scalar."""
    m = jnp.ones(probs.shape[:-1], jnp.float32) if real is None else real.astype(jnp.float32)
    onehot = jax.lax.stop_gradient(jax.nn.one_hot(selected, probs.shape[-1], dtype=jnp.float32))
    return {"choice": jnp.einsum("bt,btke->ke", m, onehot), "prob": jnp.einsum("bt,bte->e", m, probs),
            "tokens": jnp.sum(m)}


def load_balancing_loss(stats: dict, coef: float) -> jnp.ndarray:
    """coef · E · Σ_{k,e} f[k, e] · P[e] from per-layer `gate_stats` stacked over layers ([L, ...]):
    the Mixtral loss over every (layer, real token) pair, as MoE-PEFT computes it."""
    n = jnp.maximum(jnp.sum(stats["tokens"]), 1.0)
    f = jnp.sum(stats["choice"], axis=0) / n                  # [k, E]
    prob = jnp.sum(stats["prob"], axis=0) / n                 # [E]
    return coef * prob.shape[-1] * jnp.sum(f * prob[None, :])

