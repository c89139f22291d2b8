"""Config sections -> the dataclasses that validate them (one place for trainer, sweep and tests)."""

from __future__ import annotations

from dart_jax.adapters.method import MethodSpec
from dart_jax.rewards.training import RewardConfig
from dart_jax.rl.optim import OptimConfig
from dart_jax.rl.step import LossConfig


def section(config, name: str) -> dict:
    """A config section as a dict; lists become tuples (ml_collections keeps tuples as lists)."""
    if name not in config:
        return {}
    return {k: tuple(v) if isinstance(v, list) else v for k, v in dict(config[name]).items()}


def method_spec(config) -> MethodSpec:
    return MethodSpec(**section(config, "method"))


def loss_config(config) -> LossConfig:
    """config.loss; seq-mean-token-sum-norm's L defaults to rollout.max_response_tokens (verl pads its
    response arrays to the configured response length and divides by that width)."""
    fields = section(config, "loss")
    if not fields.get("norm_length") and "rollout" in config:
        fields["norm_length"] = int(config.rollout.max_response_tokens)
    return LossConfig(**fields)


def reward_config(config) -> RewardConfig:
    return RewardConfig(**section(config, "reward"))


def optim_config(config) -> OptimConfig:
    return OptimConfig(**section(config, "optim"))

