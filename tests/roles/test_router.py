"""Router ψ: hand-worked cases, malformed tags, and batch form == incremental form (hypothesis)."""

import jax.numpy as jnp
import numpy as np
import pytest
from hypothesis import given, settings, strategies as st

from dart_jax.roles.router import (
    PAD_ROLE,
    REASONING,
    TOOL,
    RouterSpec,
    init_state,
    loss_roles,
    route_roles,
    route_step,
    state_after,
)

O, C = 100, 101  # <search>, </search>
SPEC = RouterSpec((O,), (C,))
AUTHORS = RouterSpec((O,), (C,), "authors")
R, T, P = REASONING, TOOL, PAD_ROLE


def roles(tokens, spec=SPEC):
    return np.asarray(route_roles(jnp.asarray([tokens]), spec))[0].tolist()


def test_hand_worked_example():
    #        think  <s>  q1  q2  </s>  info  ans
    toks = [5,     O,   7,  8,  C,    9,    10]
    assert roles(toks) == [R, T, T, T, R, R, R]
    # the logits at positions 1..3 predict q1, q2, </search>: all from the tool adapter
    assert np.asarray(loss_roles(jnp.asarray([roles(toks)])))[0].tolist() == [P, R, T, T, T, R, R]
    # authors: positions p_open+1 .. p_close
    assert roles(toks, AUTHORS) == [R, R, T, T, T, R, R]


def test_malformed_tags_are_deterministic():
    assert roles([C, 5, C]) == [R, R, R]                       # close while closed: nothing
    assert roles([O, 5, O, 6, C, 7]) == [T, T, T, T, R, R]     # re-open while open: stays open
    assert roles([5, O, 6, 7]) == [R, T, T, T]                 # unterminated: open to the end
    assert roles([O, C, C, O]) == [T, R, R, T]


def test_multiple_tag_pairs_and_validity():
    spec = RouterSpec((O, 200), (C, 201))
    assert roles([200, 5, 201, O, C], spec) == [T, T, R, T, R]
    valid = jnp.asarray([[False, True, True]])
    assert np.asarray(route_roles(jnp.asarray([[0, O, 5]]), SPEC, valid))[0].tolist() == [P, T, T]
    with pytest.raises(ValueError, match="both to open and to close"):
        RouterSpec((O,), (O,))


def incremental(tokens, spec):
    b = tokens.shape[0]
    state = init_state(b)
    out = []
    for t in range(tokens.shape[1]):
        state, r = route_step(state, jnp.asarray(tokens[:, t]), spec)
        out.append(np.asarray(r))
    return np.stack(out, axis=1), np.asarray(state)


@settings(max_examples=60, deadline=None)
@given(st.lists(st.lists(st.sampled_from([1, 2, 3, O, C]), min_size=12, max_size=12), min_size=1, max_size=4),
       st.sampled_from(["dart_jax", "authors"]))
def test_batch_form_equals_incremental_form(rows, convention):
    spec = RouterSpec((O,), (C,), convention)
    tokens = np.asarray(rows, np.int32)
    batch = np.asarray(route_roles(jnp.asarray(tokens), spec))
    inc, final_state = incremental(tokens, spec)
    np.testing.assert_array_equal(batch, inc)
    np.testing.assert_array_equal(np.asarray(state_after(jnp.asarray(tokens), spec)), final_state)
    # resuming from state_after a prefix gives the same roles as routing the whole stream
    for cut in (1, 5, 11):
        state = state_after(jnp.asarray(tokens[:, :cut]), spec)
        for t in range(cut, tokens.shape[1]):
            state, r = route_step(state, jnp.asarray(tokens[:, t]), spec)
            np.testing.assert_array_equal(np.asarray(r), batch[:, t])
