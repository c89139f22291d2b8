"""Optimiser, learning-rate schedule and the schedule's clock (verl's).

AdamW (β = (0.9, 0.999), ε = 1e-8, decoupled weight decay 0.01 as torch.optim.AdamW) after global-
norm clipping (1.0), split in two so the learning rate can run on its own clock:

    d = AdamW direction (clip → m̂ / (√v̂ + ε) → + wd·θ)     `make_optimizer` (optax, state: moments)
    θ ← θ − lr(k)·d                                         `apply_update`, in the jitted step

The schedule, over its clock k (0-based):
    constant:  lr·k/W for k < W, then lr                    (verl: lr 0 at k = 0 when W > 0)
    cosine:    the same warmup, then lr_min + ½(lr − lr_min)(1 + cos(π (k−W)/(K−W)))

Clock (`schedule_clock`): "rl_step" (default, verl) — k = the RL step; every mini-batch update of one
RL step uses the same lr (verl calls lr_scheduler.step() once per RL step, after all its updates), so
warmup_steps / total_steps count RL steps. "update" — k = optimiser updates applied so far (optax's
own count; with 4 mini-batches per step a 10-step warmup then ends after 2.5 RL steps).
Non-finite gradient norms never reach the optimiser: the train step skips them (see step.py).
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import optax

from dart_jax.run.spec import OptimConfig


def learning_rate(cfg: OptimConfig) -> optax.Schedule:
    """lr as a function of the schedule's clock k (see the module docstring)."""
    warm = max(int(cfg.warmup_steps), 0)
    if cfg.schedule == "cosine":
        decay = max(int(cfg.total_steps) - warm, 1)
        return optax.join_schedules(
            [optax.linear_schedule(0.0, cfg.lr, max(warm, 1)),
             optax.cosine_decay_schedule(cfg.lr, decay, alpha=cfg.min_lr_ratio)], [warm])
    if warm == 0:
        return optax.constant_schedule(cfg.lr)
    return optax.join_schedules([optax.linear_schedule(0.0, cfg.lr, warm), optax.constant_schedule(cfg.lr)], [warm])


def clock(cfg: OptimConfig, rl_step, updates) -> jnp.ndarray:
    """The schedule's k: the RL step (verl) or the number of optimiser updates applied so far."""
    return jnp.asarray(rl_step if cfg.schedule_clock == "rl_step" else updates, jnp.int32)


def make_optimizer(cfg: OptimConfig) -> optax.GradientTransformation:
    """The AdamW direction d at unit learning rate: clip → scale_by_adam → add_decayed_weights (optax's
    adamw without its final −lr scale). `apply_update` applies θ − lr·d."""
    parts = [optax.scale_by_adam(b1=cfg.b1, b2=cfg.b2, eps=cfg.eps)]
    if cfg.weight_decay:
        parts.append(optax.add_decayed_weights(cfg.weight_decay))
    if cfg.clip_norm is not None:
        parts.insert(0, optax.clip_by_global_norm(cfg.clip_norm))
    return optax.chain(*parts)


def apply_update(params, direction, lr):
    """θ ← θ − lr·d, in the parameters' dtype (fp32 masters)."""
    return jax.tree.map(lambda p, d: (p - lr * d).astype(p.dtype), params, direction)
