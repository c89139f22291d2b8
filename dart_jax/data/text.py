"""SQuAD answer normalisation (Search-R1's EM): what EM compares and what makes two questions the same
question (training / evaluation exclusion)."""

from __future__ import annotations

import re
import string

_ARTICLES = re.compile(r"\b(a|an|the)\b")
_PUNCT = set(string.punctuation)


def normalize_answer(s: str) -> str:
    """lowercase → drop punctuation → drop articles a/an/the → collapse whitespace."""
    s = s.lower()
    s = "".join(ch for ch in s if ch not in _PUNCT)
    s = _ARTICLES.sub(" ", s)
    return " ".join(s.split())
