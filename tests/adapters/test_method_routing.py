"""The method as one object (adapters.method): its route mode per variant, the route ids of each route
mode, the routes its trajectories and train batches carry per role, and 2-Agent's per-token choice
between its two models' log-probs."""

import jax.numpy as jnp
import numpy as np
import pytest

from dart_jax.adapters.method import (
    ROUTE_MODES,
    VARIANTS,
    MethodSpec,
    TwoModels,
    mode_routes,
    routes_for,
    two_model_logprobs,
    two_model_route_mode,
)
from dart_jax.roles.router import PAD_ROLE, REASONING, TOOL
from dart_jax.rollout.sampler import SamplerSpec

R, T, P = REASONING, TOOL, PAD_ROLE
ROLES = jnp.asarray([[P, R, R, T, T, R], [P, P, R, T, R, R]], jnp.int32)


def test_route_mode_per_variant():
    want = {"dart": "role", "lora": "shared", "mixlora": "shared", "full": "none", "2agent": "none"}
    assert set(want) == set(VARIANTS)
    for variant, mode in want.items():
        assert MethodSpec(variant).route_mode == mode
        assert mode in ROUTE_MODES
    assert MethodSpec("2agent", agent_params="lora").route_mode == "none"


def test_route_ids_of_each_mode():
    np.testing.assert_array_equal(mode_routes("role", ROLES), ROLES)
    np.testing.assert_array_equal(mode_routes("shared", ROLES), np.where(np.asarray(ROLES) == P, -1, 0))
    np.testing.assert_array_equal(mode_routes("none", ROLES), np.full(ROLES.shape, -1))
    assert all(mode_routes(m, ROLES).dtype == jnp.int32 for m in ROUTE_MODES)
    with pytest.raises(ValueError, match="route_mode='x'"):
        mode_routes("x", ROLES)


@pytest.mark.parametrize("variant", VARIANTS)
def test_routes_per_role(variant):
    """A reasoning token routes to adapter 0 under dart, lora and mixlora, a tool token to 1 under dart
    only; full routes nothing; 2-Agent's batches carry the roles (its models are picked by them)."""
    got = np.asarray(routes_for(MethodSpec(variant), ROLES))
    roles = np.asarray(ROLES)
    reas, tool, pad = got[roles == R], got[roles == T], got[roles == P]
    assert (pad == -1).all()
    expect = {"dart": (0, 1), "2agent": (0, 1), "lora": (0, 0), "mixlora": (0, 0), "full": (-1, -1)}[variant]
    assert (reas == expect[0]).all() and (tool == expect[1]).all()


def test_the_sampler_routes_as_the_method():
    """SamplerSpec.routes is the method's mode_routes: one mapping from roles to route ids."""
    for variant in ("dart", "lora", "mixlora", "full"):
        method = MethodSpec(variant)
        spec = SamplerSpec(None, None, None, ((1,),), method.route_mode)
        np.testing.assert_array_equal(spec.routes(ROLES), routes_for(method, ROLES))


def test_two_model_logprobs_picks_the_writer():
    """Token t takes the values of the model in control after token t − 1 (its loss role); a model
    with a LoRA routes it to every real token, a model without one gets no route ids."""
    seen = []

    def score(base, adapters, routes):
        seen.append((base, routes))
        v = jnp.full(ROLES.shape, 1.0 if base == "reas" else 2.0)
        return v, 10 * v

    two = TwoModels("reas", "tool", None, {"shared": "lora"})
    logp, ent = two_model_logprobs(two, ROLES, score)
    writer = np.concatenate([np.full((2, 1), P), np.asarray(ROLES)[:, :-1]], axis=1)
    np.testing.assert_array_equal(logp, np.where(writer == T, 2.0, 1.0))
    np.testing.assert_array_equal(ent, np.where(writer == T, 20.0, 10.0))
    assert seen[0] == ("reas", None)
    assert seen[1][0] == "tool"
    np.testing.assert_array_equal(seen[1][1], mode_routes("shared", ROLES))
    assert two_model_route_mode(None) == "none" and two_model_route_mode({"shared": 0}) == "shared"
