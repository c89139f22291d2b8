"""Optimiser and learning-rate schedule (REFERENCE §6).

AdamW (β = (0.9, 0.999), ε = 1e-8, decoupled weight decay 0.01 as torch.optim.AdamW) after global-
norm clipping (1.0). Schedule per optimiser update k (0-based):
    constant:  lr·k/W for k < W, then lr          (verl: the first update has lr 0 when W > 0)
    cosine:    the same warmup, then lr_min + ½(lr − lr_min)(1 + cos(π (k−W)/(K−W)))
Non-finite gradient norms never reach the optimiser: the train step skips them (see step.py).
"""

from __future__ import annotations

import dataclasses

import optax

SCHEDULES = ("constant", "cosine")


@dataclasses.dataclass(frozen=True)
class OptimConfig:
    lr: float = 1e-5
    warmup_steps: int = 0
    total_steps: int = 100
    schedule: str = "constant"
    min_lr_ratio: float = 0.0
    weight_decay: float = 0.01
    b1: float = 0.9
    b2: float = 0.999
    eps: float = 1e-8
    clip_norm: float | None = 1.0

    def __post_init__(self):
        if self.schedule not in SCHEDULES:
            raise ValueError(f"optim.schedule={self.schedule!r}; expected one of {SCHEDULES}")
        if self.lr < 0 or self.warmup_steps < 0:
            raise ValueError(f"optim.lr ({self.lr}) and optim.warmup_steps ({self.warmup_steps}) must be ≥ 0")


def learning_rate(cfg: OptimConfig) -> optax.Schedule:
    warm = max(int(cfg.warmup_steps), 0)
    if cfg.schedule == "cosine":
        decay = max(int(cfg.total_steps) - warm, 1)
        return optax.join_schedules(
            [optax.linear_schedule(0.0, cfg.lr, max(warm, 1)),
             optax.cosine_decay_schedule(cfg.lr, decay, alpha=cfg.min_lr_ratio)], [warm])
    if warm == 0:
        return optax.constant_schedule(cfg.lr)
    return optax.join_schedules([optax.linear_schedule(0.0, cfg.lr, warm), optax.constant_schedule(cfg.lr)], [warm])


def make_optimizer(cfg: OptimConfig) -> optax.GradientTransformation:
    adamw = optax.adamw(learning_rate(cfg), b1=cfg.b1, b2=cfg.b2, eps=cfg.eps, weight_decay=cfg.weight_decay)
    if cfg.clip_norm is None:
        return adamw
    return optax.chain(optax.clip_by_global_norm(cfg.clip_norm), adamw)
