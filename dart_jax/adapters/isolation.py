"""Gradient isolation between the reasoning and tool adapters.

forward (the paper's practice): one forward with per-token routing, one backward. A reasoning
token's loss still reaches the tool adapter through attention to earlier tool positions, so the
adapters are separated on the direct path only.

strict: L = Σ_role L_role(θ_role, sg(θ_others)), one forward/backward per role. Each pass uses every
adapter's values (same routing, same logits) but only the adapter of the role whose tokens carry
that pass's loss receives gradient, so ∂L_reas/∂θ_tool = 0 and ∂L_tool/∂θ_reas = 0 exactly.

Both need a loss that is linear in per-token losses with weights that depend only on masks:
L = Σ_{b,t} w_{b,t} ℓ_{b,t}(θ). Every one of verl's aggregation modes has that form.
"""

from __future__ import annotations

from typing import Any, Callable, Mapping

import jax
import jax.numpy as jnp

from dart_jax.models.lora import LoraAdapter, adapter_names


def isolated_loss(per_token_loss: Callable[[Mapping[str, LoraAdapter]], Any],
                  adapters: Mapping[str, LoraAdapter], weights: jnp.ndarray,
                  token_routes: jnp.ndarray, isolation: str, has_aux: bool = False):
    """per_token_loss(adapters) -> ℓ f32[B, T] (token t's loss), or (ℓ, aux) with `has_aux`;
    weights f32[B, T]; token_routes i32[B, T]: the adapter index that predicted token t (route of
    position t−1). Returns Σ w·ℓ, or (Σ w·ℓ, aux of the first pass): every pass computes the same
    values, only the gradients differ."""
    call = per_token_loss if has_aux else (lambda ads: (per_token_loss(ads), None))
    if isolation == "forward":
        loss, aux = call(adapters)
        total = jnp.sum(weights * loss)
        return (total, aux) if has_aux else total
    if isolation != "strict":
        raise ValueError(f"isolation={isolation!r}; expected 'forward' or 'strict'")
    total, first = jnp.zeros((), jnp.float32), None
    for i, name in enumerate(adapter_names(adapters)):
        only = {n: (a if n == name else jax.lax.stop_gradient(a)) for n, a in adapters.items()}
        role_w = jnp.where(token_routes == i, weights, 0.0)
        loss, aux = call(only)
        first = aux if first is None else first
        total = total + jnp.sum(role_w * loss)
    return (total, first) if has_aux else total
