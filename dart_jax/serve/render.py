"""A trajectory for people to read: the question, each turn (the reasoning, the tool call, the
observation it got back), the answer, and how the tokens were routed.

    Q  Who founded the company that published The Furnish Bridge?
    ── turn 1 · reasoning 31 tokens, tool 6
    think   I need the publisher of The Furnish Bridge. Searching The Furnish Bridge.
    search  The Furnish Bridge
    result  Doc 1(Title: "The Furnish Bridge") The Furnish Bridge is an essay by … (312 chars; --full shows all)
    ...
    A  Droar Nourorn          (finish answer · 2 tool calls · reasoning 71 / tool 14 tokens)

The pieces come from the trajectory's own ids: the generated runs between observations (each one a
turn) and the observation spans, decoded apart, so what is shown is exactly what the policy wrote and
read.
"""

from __future__ import annotations

import re

from dart_jax.rollout.protocol import Protocol
from dart_jax.serve.requests import route_counts

OBS_CHARS = 240


def _pieces(traj: dict) -> list[tuple[str, list[int], list[int]]]:
    """[(kind "gen" | "obs", ids, routes)] in order."""
    ids, routes, out, at = traj["ids"], traj["routes"], [], 0
    for start, length, _tool in traj["spans"]:
        if start > at:
            out.append(("gen", ids[at:start], routes[at:start]))
        out.append(("obs", ids[start:start + length], routes[start:start + length]))
        at = start + length
    if at < len(ids):
        out.append(("gen", ids[at:], routes[at:]))
    return out


def _tag_body(text: str, open_tag: str, close_tag: str) -> list[str]:
    return [m.strip() for m in re.findall(re.escape(open_tag) + r"(.*?)" + re.escape(close_tag), text, re.S)]


def answer_of(text: str, protocol: Protocol) -> str | None:
    found = _tag_body(text, protocol.answer_open, protocol.answer_close)
    return found[-1] if found else None


def transcript(tokenizer, protocol: Protocol, traj: dict, question: str | None = None, full: bool = False,
               gold: list[str] | None = None, route_names: dict[int, str] | None = None) -> str:
    """The trajectory as text (module doc); `full`: observations and reasoning uncut; `gold`: the
    dataset's answers, shown beside the model's."""
    names = route_names or {0: "reasoning", 1: "tool"}
    lines = [f"Q  {question}"] if question else []
    turn = 0
    everything = ""
    for kind, ids, routes in _pieces(traj):
        text = tokenizer.decode(ids, skip_special_tokens=True)
        everything += text
        if kind == "obs":
            body = text.strip()
            for tag in (protocol.obs_open, protocol.obs_close):
                body = body.replace(tag, "").strip()
            shown = body if full or len(body) <= OBS_CHARS else f"{body[:OBS_CHARS]} … ({len(body)} chars; --full " \
                                                                 f"shows all)"
            lines.append("result  " + shown.replace("\n", "\n        "))
            continue
        turn += 1
        counts = route_counts(routes, [1.0] * len(routes), names)
        lines.append(f"── turn {turn} · " + ", ".join(f"{k} {v}" for k, v in counts.items()) + " tokens")
        thinks = _tag_body(text, "<think>", "</think>")
        calls = _tag_body(text, protocol.tool_open, protocol.tool_close)
        said = answer_of(text, protocol)
        for t in thinks:
            lines.append("think   " + t.replace("\n", "\n        "))
        for c in calls:
            lines.append(f"{protocol.tool_open.strip('<>'):<7} " + c)
        if not (thinks or calls or said is not None) or full:
            if full:
                lines.append("text    " + text.strip().replace("\n", "\n        "))
            else:
                lines.append("text    " + text.strip()[:OBS_CHARS].replace("\n", "\n        "))
    answer = answer_of(everything, protocol)
    total = route_counts(traj["routes"], traj["mask"], names)
    tail = f"finish {traj['finish']} · {traj['tool_calls']} tool call{'s' if traj['tool_calls'] != 1 else ''}"
    if total:
        tail += " · " + " / ".join(f"{k} {v}" for k, v in total.items()) + " tokens"
    lines.append(f"A  {answer if answer is not None else '(no answer)'}    ({tail})")
    if gold:
        lines.append(f"   gold: {' | '.join(gold)}")
    return "\n".join(lines)
