"""From trajectories to train-step arrays: the recorded routes checked against the router, loss roles,
CEA role masks, padding, and GRPO advantages per prompt uid — checked on a hand-built trajectory."""

import numpy as np
import pytest

from dart_jax.adapters.method import MethodSpec
from dart_jax.rl.batch import build_batch, minibatches
from dart_jax.roles.router import RouterSpec
from dart_jax.rollout.trajectory import assemble

OPEN, CLOSE = 90, 91
ROUTER = RouterSpec((OPEN,), (CLOSE,))


# what a sampler of each route mode records for row 0 (prompt + response) and for row 1
ROUTES = {"role": ([0, 0, 0, 1, 1, 1, 0, 0, 0, 0, 0], [0] * 5), "shared": ([0] * 11, [0] * 5),
          "none": ([-1] * 11, [-1] * 5)}


def _trajectories(mode="role"):
    # prompt [5, 6]; response: 7 <search> 8 9 </search> | obs 50 51 | 10 11
    r0, r1 = ROUTES[mode]
    resp = {"ids": [7, OPEN, 8, 9, CLOSE, 50, 51, 10, 11], "mask": [1, 1, 1, 1, 1, 0, 0, 1, 1],
            "logprobs": [-1.0] * 9, "routes": r0[2:]}
    short = {"ids": [12, 13], "mask": [1, 1], "logprobs": [-0.5, -0.5], "routes": r1[3:]}
    return assemble([[5, 6], [5, 6, 4]], [r0[:2], r1[:3]], [resp, short], ["q1", "q2"],
                    ["answer", "answer"], [[], []], ["", ""])


@pytest.mark.parametrize("role_mask,expect", [
    # token:          5  6  7  <s> 8  9  </s> 50 51 10 11
    ("both",      [0, 0, 1, 1,  1, 1, 1,   0, 0, 1, 1]),
    ("reasoning", [0, 0, 1, 1,  0, 0, 0,   0, 0, 1, 1]),
    ("tool",      [0, 0, 0, 0,  1, 1, 1,   0, 0, 0, 0]),
])
def test_role_masks_follow_loss_roles(role_mask, expect):
    b = build_batch(_trajectories(), np.asarray([1.0, 0.0]), MethodSpec("dart", role_mask=role_mask), ROUTER,
                    pad_multiple=16)
    assert b["tokens"].shape == (2, 16)
    np.testing.assert_array_equal(b["loss_mask"][0, :11], expect)
    assert b["loss_mask"][0, 11:].sum() == 0
    # routes: tool from <search>'s position through the last query token; loss roles shifted by one
    np.testing.assert_array_equal(b["route_ids"][0, :11], [0, 0, 0, 1, 1, 1, 0, 0, 0, 0, 0])
    np.testing.assert_array_equal(b["loss_roles"][0, :11], [-1, 0, 0, 0, 1, 1, 1, 0, 0, 0, 0])
    assert (b["route_ids"][0, 11:] == -1).all() and (b["positions"][0, 11:] == -1).all()


def test_variants_route_and_advantages():
    lora = build_batch(_trajectories("shared"), np.asarray([1.0, 0.0]), MethodSpec("lora"), ROUTER, pad_multiple=16)
    assert set(np.unique(lora["route_ids"][0, :11])) == {0}
    full = build_batch(_trajectories("none"), np.asarray([1.0, 0.0]), MethodSpec("full"), ROUTER, pad_multiple=16)
    assert (full["route_ids"] == -1).all()
    # two different uids: singleton groups, A = s / (1 + 1e-6)
    np.testing.assert_allclose(full["advantages"], [1.0 / (1 + 1e-6), 0.0], rtol=1e-6)
    np.testing.assert_array_equal(full["sampler_logp"][1, 3:5], [-0.5, -0.5])


def test_minibatches_shape_and_divisibility():
    batch = {"x": np.arange(8 * 3).reshape(8, 3)}
    out = list(minibatches(batch, np.arange(8)[::-1], 4, 2, ("x",)))
    assert len(out) == 2 and out[0]["x"].shape == (2, 2, 3)
    np.testing.assert_array_equal(out[0]["x"][0, 0], [21, 22, 23])
    with pytest.raises(ValueError, match="mini-batches of 3"):
        list(minibatches(batch, np.arange(8), 3, 1, ("x",)))


def test_invalid_rows_keep_their_place_but_carry_no_loss():
    """A prompt whose reference failed (valid False): its rows stay in the batch, mask and advantage 0;
    the other rows are untouched."""
    tb = _trajectories()
    ok = build_batch(tb, np.asarray([1.0, 0.0]), MethodSpec("dart"), ROUTER, pad_multiple=16)
    b = build_batch(tb, np.asarray([1.0, 0.0]), MethodSpec("dart"), ROUTER, pad_multiple=16,
                    valid=np.asarray([True, False]))
    assert b["tokens"].shape == ok["tokens"].shape and b["loss_mask"][1].sum() == 0 and b["advantages"][1] == 0
    np.testing.assert_array_equal(b["loss_mask"][0], ok["loss_mask"][0])
    assert b["advantages"][0] == ok["advantages"][0]


def test_answer_role_mask_is_the_answer_span_tags_included():
    """The DART authors' M_Reas trains on the answer span only (configs/cea.py:reas,MODEL,authors).
    Tags match as any of their token sequences: here <answer> is (60, 61) or (62, 61)."""
    from dart_jax.rl.batch import answer_span_mask
    tags = (((60, 61), (62, 61)), ((63,),))
    # prompt [5, 6]; response: 7 <s> 8 </s> | obs 50 | 10 [62 61 20 21 63] 12
    resp = {"ids": [7, OPEN, 8, CLOSE, 50, 10, 62, 61, 20, 21, 63, 12], "mask": [1, 1, 1, 1, 0] + [1] * 7,
            "logprobs": [-1.0] * 12, "routes": [-1] * 12}
    tb = assemble([[5, 6]], [[-1, -1]], [resp], ["q1"], ["answer"], [[]], [""])
    b = build_batch(tb, np.asarray([1.0]), MethodSpec("full", role_mask="answer"), ROUTER, pad_multiple=16,
                    answer_tags=tags)
    want = np.zeros(16)
    want[8:13] = 1  # 62 61 20 21 63
    np.testing.assert_array_equal(b["loss_mask"][0], want)
    # an unclosed span runs to the end; an opening sequence's variants; several spans
    toks = np.array([[1, 60, 61, 2, 3], [62, 61, 4, 63, 5], [60, 61, 63, 60, 61]])
    np.testing.assert_array_equal(answer_span_mask(toks, tags).astype(int),
                                  [[0, 1, 1, 1, 1], [1, 1, 1, 1, 0], [1, 1, 1, 1, 1]])
    with pytest.raises(ValueError, match="needs answer_tags"):
        build_batch(tb, np.asarray([1.0]), MethodSpec("full", role_mask="answer"), ROUTER, pad_multiple=16)


def test_recorded_routes_must_be_the_routers():
    """The batch carries the route ids the sampler recorded; a recording that differs from the method's
    routes of the router over the ids (here: a DART batch of a LoRA recording) is refused."""
    with pytest.raises(ValueError, match=r"row 0: recorded"):
        build_batch(_trajectories("shared"), np.asarray([1.0, 0.0]), MethodSpec("dart"), ROUTER, pad_multiple=16)
