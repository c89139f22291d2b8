"""GRPO outcome advantages, grouped by prompt uid (verl's GRPO advantage).

    s_i = Σ_t r_{i,t}                                   (reward on the last response token)
    μ_g, σ_g = mean and unbiased std (÷ n−1) over the group g(i); a group of one has μ = 0, σ = 1
    A_i = (s_i − μ_g) / (σ_g + ε)   (ε = 1e-6),   or s_i − μ_g with norm_by_std=False (Dr. GRPO)

An all-equal group gives A = 0 exactly. A_i is broadcast to the tokens and multiplied by the loss
mask by the loss (`dart_jax.rl.losses`).
"""

from __future__ import annotations

from typing import Hashable, Sequence

import jax
import jax.numpy as jnp
import numpy as np


def group_index(uids: Sequence[Hashable]) -> tuple[np.ndarray, int]:
    """Prompt uids -> (dense group id i32[N] in first-seen order, number of groups)."""
    seen: dict = {}
    ids = np.asarray([seen.setdefault(u, len(seen)) for u in uids], np.int32)
    return ids, len(seen)


def grpo_advantages(scores: jnp.ndarray, group_ids: jnp.ndarray, num_groups: int,
                    norm_by_std: bool = True, eps: float = 1e-6) -> jnp.ndarray:
    """scores f32[N], group_ids i32[N] in [0, num_groups) -> advantages f32[N]."""
    scores = scores.astype(jnp.float32)
    count = jax.ops.segment_sum(jnp.ones_like(scores), group_ids, num_groups)
    mean = jax.ops.segment_sum(scores, group_ids, num_groups) / jnp.maximum(count, 1.0)
    single = count[group_ids] <= 1
    centred = scores - jnp.where(single, 0.0, mean[group_ids])
    if not norm_by_std:
        return centred
    sq = jax.ops.segment_sum(jnp.square(scores - mean[group_ids]), group_ids, num_groups)
    std = jnp.sqrt(sq / jnp.maximum(count - 1.0, 1.0))
    std = jnp.where(single, 1.0, std[group_ids])
    return centred / (std + eps)
