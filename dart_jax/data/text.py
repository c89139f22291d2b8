"""SQuAD answer normalisation (Search-R1's EM): what EM compares and what makes two questions the same
question (training / evaluation exclusion); `valid_text`: text made encodable before it enters a
prompt, a row or an observation."""

from __future__ import annotations

import re
import string

# code points a Python str may hold but UTF-8 (and every tokenizer) cannot encode: surrogates, which
# valid JSON carries as "\\ud800" escapes when they are not a high-low pair
_INVALID = re.compile("[\ud800-\udfff]")
REPLACEMENT = "\ufffd"


def valid_text(s: str) -> tuple[str, int]:
    """-> (`s` with each code point UTF-8 cannot encode, a lone surrogate, replaced by U+FFFD, how many
    were replaced). Valid text is returned as it is (the same object, count 0). One code point
    replaces one, so character offsets into the text stay valid."""
    try:
        s.encode("utf-8")
    except UnicodeEncodeError:
        return _INVALID.subn(REPLACEMENT, s)
    return s, 0


_ARTICLES = re.compile(r"\b(a|an|the)\b")
_PUNCT = set(string.punctuation)


def normalize_answer(s: str) -> str:
    """lowercase → drop punctuation → drop articles a/an/the → collapse whitespace."""
    s = s.lower()
    s = "".join(ch for ch in s if ch not in _PUNCT)
    s = _ARTICLES.sub(" ", s)
    return " ".join(s.split())
