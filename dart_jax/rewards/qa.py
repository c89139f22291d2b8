"""QA rewards (Search-R1 conventions): SQuAD normalisation, exact match on the last
<answer> of the *response*, the optional format reward, and retrieval accuracy.

A trajectory is scored on its `reward_text` (rollout.trajectory): the model's own spans, each
observation's body blanked, so a passage's <answer> or </information> can neither earn nor break a
reward (Search-R1 reads the whole text). Retrieval accuracy then reads the bodies the model received
(`observed`, `retrieval_hit`); `retrieval_correct` is Search-R1's reading of a raw text."""

from __future__ import annotations

import re

from dart_jax.data.text import normalize_answer

_ANSWER = re.compile(r"<answer>(.*?)</answer>", re.DOTALL)
_INFO = re.compile(r"<information>(.*?)</information>", re.DOTALL)


def extract_answer(response: str) -> str | None:
    """The last <answer>…</answer> of the response (never the prompt's example)."""
    found = _ANSWER.findall(response)
    return found[-1].strip() if found else None


def em(prediction: str | None, golds: list[str]) -> float:
    if prediction is None:
        return 0.0
    p = normalize_answer(prediction)
    return float(any(p == normalize_answer(g) for g in golds))


def em_reward(response: str, golds: list[str]) -> float:
    return em(extract_answer(response), golds)


def retrieval_correct(response: str, golds: list[str]) -> bool:
    """Some normalised gold answer is a substring of some normalised <information> block."""
    blocks = [normalize_answer(b) for b in _INFO.findall(response)]
    return any(normalize_answer(g) in b for g in golds for b in blocks if normalize_answer(g))


def retrieval_hit(observations: list[str], golds: list[str]) -> bool:
    """Some normalised gold answer is a substring of some normalised observation body (a trajectory's
    `observed`: what its tool returned, as the model received it)."""
    bodies = [normalize_answer(b) for b in observations]
    return any(normalize_answer(g) in b for g in golds for b in bodies if normalize_answer(g))


_TAG = re.compile(r"</?(think|search|information|answer)>")


def valid_sequence(response: str) -> bool:
    """Search-R1's structure check: think → (search → information → think)* → answer, with only
    whitespace between a closing tag and the next opening tag, ending after </answer>."""
    pos, state = 0, "start"
    allowed = {"start": {"<think>"}, "<think>": {"</think>"}, "</think>": {"<search>", "<answer>"},
               "<search>": {"</search>"}, "</search>": {"<information>"},
               "<information>": {"</information>"}, "</information>": {"<think>", "<search>", "<answer>"},
               "<answer>": {"</answer>"}}
    for m in _TAG.finditer(response):
        tag = m.group(0)
        if tag not in allowed.get(state, set()):
            return False
        between = response[pos:m.start()]
        if state in ("start", "</think>", "</search>", "</information>") and between.strip():
            return False
        pos, state = m.end(), tag
    return state == "</answer>" and not response[pos:].strip()


def em_format_reward(response: str, golds: list[str], structure_format_score: float = 0.2,
                     final_format_score: float = 0.1, retrieval_score: float = 0.1, score: float = 1.0,
                     observations: list[str] | None = None) -> float:
    """Search-R1's `qa_em_format.compute_score_em`: full score for a correct answer in a valid
    structure; partial credit for structure (and retrieval hits) otherwise. `observations`: the
    bodies the retrieval credit reads (a trajectory's `observed`, with its `reward_text` as
    `response`); None: the response's own <information> blocks (Search-R1's, for a raw text)."""
    valid = valid_sequence(response)
    retrieved = valid and (retrieval_correct(response, golds) if observations is None
                           else retrieval_hit(observations, golds))
    answer = extract_answer(response)
    if answer is None:
        return (structure_format_score + (retrieval_score if retrieved else 0.0)) if valid else 0.0
    if em(answer, golds):
        return score if valid else score - structure_format_score
    if valid:
        return structure_format_score + (retrieval_score if retrieved else 0.0)
    return final_format_score
