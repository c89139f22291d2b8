"""`--reference verl | search_r1 | dart_authors`: the conventions of the PyTorch system a user
cross-checks against, as config overrides, and the list of every place they differ from ours.

| field | dart_jax | verl | Search-R1 | DART authors |
|---|---|---|---|---|
| loss.micro_mode | global (true token mean) | verl_microbatch_mean | verl_microbatch_mean | verl_microbatch_mean |
| loss.kl_clamp | True | True | False (older verl: no ±20 / ±10 clamps) | True |
| loss.entropy_coef | 0 | 0 | 0.001 (the fork's silent default) | 0 |
| sampling.top_p | 1.0 | 1.0 | 0.95 (as reported; check your run) | 1.0 |
| router.convention | dart_jax (ψ offset) | — | — | authors (routes shifted by one) |
| rollout.invalid_action | none | — | search_r1 (corrective message) | none |
| rollout.max_obs_tokens | config | — | 500 | 1024 |

Each value is read from that system's own code. A switch changes both sides of a cross-check (our
code and the torch reference read the same LossConfig), so a PASS under `--reference verl` means
we reproduce verl's numbers, not that verl agrees with our defaults.
"""

from __future__ import annotations

REFERENCES: dict[str, dict[str, object]] = {
    "dart_jax": {},
    "verl": {"loss.micro_mode": "verl_microbatch_mean"},
    "search_r1": {"loss.micro_mode": "verl_microbatch_mean", "loss.kl_clamp": False, "loss.entropy_coef": 0.001,
                  "sampling.top_p": 0.95, "rollout.invalid_action": "search_r1", "rollout.max_obs_tokens": 500},
    "dart_authors": {"loss.micro_mode": "verl_microbatch_mean", "router.convention": "authors",
                     "rollout.invalid_action": "none", "rollout.max_obs_tokens": 1024},
}

WHY = {
    "loss.micro_mode": "verl takes the token mean per micro-batch and scales by 1/M; ours is the true mini-batch mean",
    "loss.kl_clamp": "Search-R1's older verl has no ±20 clamp on u nor ±10 on k3",
    "loss.entropy_coef": "Search-R1's fork silently used an entropy bonus of 0.001",
    "sampling.top_p": "nucleus sampling in the reference's rollouts",
    "router.convention": "the authors route positions p_open+1 … p_close (ours shifted left by one)",
    "rollout.invalid_action": "what follows an invalid action (corrective message or end of row)",
    "rollout.max_obs_tokens": "observation cap",
}


def apply_reference(config, name: str) -> list[str]:
    """Set `name`'s conventions on an ml_collections config; -> one line per field that changed."""
    if name not in REFERENCES:
        raise ValueError(f"--reference {name!r}; expected one of {sorted(REFERENCES)}")
    changed = []
    for dotted, value in REFERENCES[name].items():
        section, field = dotted.split(".")
        ours = config[section][field]
        if ours != value:
            config[section][field] = value
            changed.append(f"{dotted}: dart_jax {ours!r} → {name} {value!r} ({WHY[dotted]})")
    return changed


def loss_overrides(name: str) -> dict:
    """The LossConfig fields of a reference (for cross-checks that build a LossConfig directly)."""
    if name not in REFERENCES:
        raise ValueError(f"--reference {name!r}; expected one of {sorted(REFERENCES)}")
    return {k.split(".")[1]: v for k, v in REFERENCES[name].items() if k.startswith("loss.")}
