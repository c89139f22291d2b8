"""The agent's per-row turn decision, case by case, without a model (rollout.turn)."""

import pytest

from dart_jax.rollout.turn import SegmentEnd, TurnDecision, decide_turn, observation_fits

MAX_TURNS, MAX_RESPONSE = 2, 100


def decide(stop=None, query=None, has_answer=False, tokens=10, calls=0, invalid_action="search_r1"):
    return decide_turn(SegmentEnd(stop, query, has_answer, tokens, calls), MAX_TURNS, MAX_RESPONSE, invalid_action)


def test_the_answers_closing_tag_finishes_the_row():
    assert decide("answer") == TurnDecision("answer", "answer")
    # even out of room and after the tool budget
    assert decide("answer", tokens=MAX_RESPONSE, calls=MAX_TURNS) == TurnDecision("answer", "answer")


def test_a_tool_call_runs_the_tool_unless_the_row_is_out_of_room():
    assert decide("tool", query="capital of France") == TurnDecision("tool", None, call=True)
    assert decide("tool", query="q", tokens=MAX_RESPONSE - 1) == TurnDecision("tool", None, call=True)
    assert decide("tool", query="q", tokens=MAX_RESPONSE) == TurnDecision("tool", "length")


def test_a_closing_tool_tag_without_an_opening_one_is_invalid_even_beside_an_answer():
    assert decide("tool", query=None, has_answer=True) == TurnDecision("invalid", None, corrective=True)


@pytest.mark.parametrize("stop", [None, "eos"])
def test_an_answer_in_the_text_counts_when_no_stop_tag_ended_the_segment(stop):
    assert decide(stop, has_answer=True) == TurnDecision("answer", "answer")
    assert decide(stop, has_answer=True, tokens=MAX_RESPONSE, calls=MAX_TURNS) == TurnDecision("answer", "answer")


@pytest.mark.parametrize("stop", [None, "eos", "tool"])
def test_an_invalid_turn_ends_by_room_then_budget_then_policy(stop):
    # out of room comes first, then the spent tool budget (the answer-only segment), then invalid_action
    assert decide(stop, tokens=MAX_RESPONSE, calls=MAX_TURNS) == TurnDecision("invalid", "length")
    assert decide(stop, calls=MAX_TURNS) == TurnDecision("invalid", "budget")
    assert decide(stop, calls=MAX_TURNS, invalid_action="none") == TurnDecision("invalid", "budget")
    assert decide(stop, calls=MAX_TURNS - 1, invalid_action="none") == TurnDecision("invalid", "invalid")
    # Search-R1: the corrective message is appended and the row goes on
    assert decide(stop, calls=MAX_TURNS - 1) == TurnDecision("invalid", None, corrective=True)


def test_an_observation_must_leave_room_for_one_more_token():
    assert observation_fits(90, 9, MAX_RESPONSE)
    assert not observation_fits(90, 10, MAX_RESPONSE)
    assert not observation_fits(90, 11, MAX_RESPONSE)
