"""GRPO / PPO loss terms as pure functions (verl's KL estimators, clipped loss and aggregation). All
per-token arrays are f32[B, T], token-aligned, and every aggregate is taken over loss-mask tokens only.

KL estimators, d = logp − ref_logp:
    k1 = d;  abs = |d|;  k2 = ½ d²;
    k3 (low_var_kl) = clamp(exp(u) − u − 1, −10, 10),  u = clamp(ref_logp − logp, −20, 20)

Clipped policy loss (verl "vanilla"):
    Δ = clamp(logp − old_logp, −20, 20);  ratio = e^Δ
    L1 = −A·ratio;  L2 = −A·clamp(ratio, 1−ε_low, 1+ε_high);  Lclip = max(L1, L2)
    L3 = −A·c;  ℓ = min(L3, Lclip) where A < 0 (dual clip, c > 1), else Lclip

Aggregation of per-token ℓ with mask m (verl's modes), each written as Σ w·ℓ / D so that a mini-batch
split into micro-batches can carry (Σ numerator, Σ D):
    token-mean               w = m,                      D = Σ m
    seq-mean-token-sum       w = m,                      D = #rows with Σ_t m > 0
    seq-mean-token-mean      w = m / Σ_t m (per row),    D = #rows with Σ_t m > 0
    seq-mean-token-sum-norm  w = m,                      D = L (per micro-batch)
L is a constant: verl divides by `loss_mask.shape[-1]`, and its response arrays are always padded to
the configured maximum response length, so L = `rollout.max_response_tokens` (LossConfig.norm_length),
whatever width the prompt + response arrays here happen to have (Dr. GRPO's constant normaliser).
"""

from __future__ import annotations

import jax.numpy as jnp

from dart_jax.run.spec import AGG_MODES, KL_TYPES, MICRO_MODES


def kl_penalty(logp: jnp.ndarray, ref_logp: jnp.ndarray, kind: str = "k3", clamp: bool = True) -> jnp.ndarray:
    """Per-token KL estimate of π against the reference. `clamp=False` drops k3's ±20 / ±10 clamps
    (Search-R1's older verl)."""
    d = logp - ref_logp
    if kind == "k1":
        return d
    if kind == "abs":
        return jnp.abs(d)
    if kind == "k2":
        return 0.5 * jnp.square(d)
    if kind == "k3":
        u = ref_logp - logp
        if clamp:
            u = jnp.clip(u, -20.0, 20.0)
        kl = jnp.exp(u) - u - 1.0
        return jnp.clip(kl, -10.0, 10.0) if clamp else kl
    raise ValueError(f"kl type {kind!r}; expected one of {KL_TYPES}")


def clipped_policy_loss(logp: jnp.ndarray, old_logp: jnp.ndarray, advantages: jnp.ndarray,
                        clip_low: float = 0.2, clip_high: float = 0.2, dual_clip: float | None = 3.0
                        ) -> tuple[jnp.ndarray, dict[str, jnp.ndarray]]:
    """-> (ℓ f32[B, T], per-token indicators {clipped, clipped_lower, neg_approx_kl}) for metrics:
    pg_clipfrac = agg(L2 > L1), pg_clipfrac_lower = agg(dual clip active), ppo_kl = agg(−Δ)."""
    if dual_clip is not None and dual_clip <= 1.0:
        raise ValueError(f"dual clip constant must be > 1, got {dual_clip}")
    delta = jnp.clip(logp - old_logp, -20.0, 20.0)
    ratio = jnp.exp(delta)
    l1 = -advantages * ratio
    l2 = -advantages * jnp.clip(ratio, 1.0 - clip_low, 1.0 + clip_high)
    lclip = jnp.maximum(l1, l2)
    clipped = (l2 > l1).astype(jnp.float32)
    if dual_clip is None:
        loss, lower = lclip, jnp.zeros_like(lclip)
    else:
        l3 = -advantages * dual_clip
        lower = ((lclip > l3) & (advantages < 0)).astype(jnp.float32)
        loss = jnp.where(advantages < 0, jnp.minimum(l3, lclip), lclip)
    return loss, {"clipped": clipped, "clipped_lower": lower, "ppo_kl": -delta}


def aggregation_weights(mask: jnp.ndarray, mode: str = "token-mean", norm_length: int | None = None
                        ) -> tuple[jnp.ndarray, jnp.ndarray]:
    """mask f32[B, T] -> (w f32[B, T], D scalar) with agg(ℓ) = Σ w·ℓ / D (see module docstring).
    `norm_length`: seq-mean-token-sum-norm's L (required by that mode)."""
    mask = mask.astype(jnp.float32)
    row = jnp.sum(mask, axis=-1)
    rows = jnp.sum((row > 0).astype(jnp.float32))
    if mode == "token-mean":
        return mask, jnp.sum(mask)
    if mode == "seq-mean-token-sum":
        return mask, rows
    if mode == "seq-mean-token-mean":
        return mask / jnp.maximum(row, 1.0)[:, None], rows
    if mode == "seq-mean-token-sum-norm":
        if not norm_length or norm_length <= 0:
            raise ValueError("loss aggregation 'seq-mean-token-sum-norm' divides by the configured maximum "
                             f"response length; got norm_length={norm_length!r} (set rollout.max_response_tokens "
                             "or loss.norm_length)")
        return mask, jnp.asarray(norm_length, jnp.float32)
    raise ValueError(f"loss aggregation {mode!r}; expected one of {AGG_MODES}")


def aggregate(values: jnp.ndarray, mask: jnp.ndarray, mode: str = "token-mean",
              norm_length: int | None = None) -> jnp.ndarray:
    """agg(ℓ) over one batch; 0 when no token carries loss. Values outside the mask are zeroed first,
    so a NaN / inf there (padding, observations) cannot poison the sum."""
    w, d = aggregation_weights(mask, mode, norm_length)
    return jnp.sum(w * jnp.where(mask > 0, values, 0.0)) / jnp.maximum(d, 1e-8) * (d > 0)


def micro_scales(denominators: jnp.ndarray, micro_mode: str = "global") -> jnp.ndarray:
    """Per-micro-batch factors c_m with loss = Σ_m c_m Σ w_m·ℓ_m.

    global: c_m = 1 / Σ_m' D_m' (the aggregate over the whole mini-batch: the carried (sum, count)).
    verl_microbatch_mean: c_m = 1 / (M · D_m) (each micro-batch's own aggregate, scaled by 1/M as
    verl's grad accumulation does; micro-batches without loss tokens contribute 0)."""
    d = denominators.astype(jnp.float32)
    if micro_mode == "global":
        total = jnp.sum(d)
        return jnp.where(total > 0, 1.0 / jnp.maximum(total, 1e-8), 0.0) * jnp.ones_like(d)
    if micro_mode == "verl_microbatch_mean":
        return jnp.where(d > 0, 1.0 / (d.shape[0] * jnp.maximum(d, 1e-8)), 0.0)
    raise ValueError(f"micro-batch mode {micro_mode!r}; expected one of {MICRO_MODES}")
