"""One row's turn decision in the agent loop (rollout.agent): what a decode segment's end means next.

    segment ended by ...            action     then
    the answer's closing tag        answer     the row finishes ("answer")
    the tool's closing tag, a call  tool       the tool runs on the query (out of room: "length")
    the tool's closing tag, no      invalid  ┐
      opening tag before it                  │ out of room: "length"; the answer-only segment
    anything else (eos, budget):             ├ (tool budget spent): "budget"; invalid_action "none":
      an answer in the text         answer   │ "invalid"; else (Search-R1) the corrective message
      no answer                     invalid  ┘ is appended and the row goes on

A pure function of the row's facts (`SegmentEnd`), no model or tokenizer: tested case by case.
"""

from __future__ import annotations

import dataclasses

ACTIONS = ("answer", "tool", "invalid")


@dataclasses.dataclass(frozen=True)
class SegmentEnd:
    """What one row's decode segment ended with."""
    stop: str | None        # the stop group that ended it ("answer", "tool", "eos"); None: the token budget
    query: str | None       # the tool call parsed from the segment (tool stop only); None: no opening tag
    has_answer: bool        # the segment's text holds the answer's opening and closing tags
    response_tokens: int    # the row's response length after the segment (generated + observations)
    calls: int              # tool calls the row made before this segment


@dataclasses.dataclass(frozen=True)
class TurnDecision:
    action: str              # "answer" | "tool" | "invalid": the turn record's action
    finish: str | None       # the row's finish reason when it ends here ("answer", "length", "budget", "invalid")
    call: bool = False       # run the tool on the segment's query
    corrective: bool = False  # append the protocol's invalid-action message as an observation


def decide_turn(end: SegmentEnd, max_turns: int, max_response_tokens: int, invalid_action: str) -> TurnDecision:
    """The next step of a row whose segment ended as `end` (the table in the module doc). `max_turns`:
    the tool budget (after it, the segment was the answer-only one); `invalid_action`: "search_r1"
    (corrective message) or "none" (the row ends)."""
    out_of_room = end.response_tokens >= max_response_tokens
    if end.stop == "answer":
        return TurnDecision("answer", "answer")
    if end.stop == "tool" and end.query is not None:
        return TurnDecision("tool", "length") if out_of_room else TurnDecision("tool", None, call=True)
    if end.stop != "tool" and end.has_answer:
        return TurnDecision("answer", "answer")
    if out_of_room:
        return TurnDecision("invalid", "length")
    if end.calls >= max_turns:
        return TurnDecision("invalid", "budget")  # the answer-only segment gave no answer
    if invalid_action == "none":
        return TurnDecision("invalid", "invalid")
    return TurnDecision("invalid", None, corrective=True)


def observation_fits(response_tokens: int, observation_tokens: int, max_response_tokens: int) -> bool:
    """Whether an observation joins the row (else the row finishes with "length"): the response must
    keep room for at least one more token after it."""
    return response_tokens + observation_tokens < max_response_tokens
