"""Tokenizer loading (HF directory or GGUF file, via transformers) and chat prompts.

Untrusted text. The sentinel tags and chat markers are added tokens, so any text containing
"<search>" or "<|im_end|>" would become that id and move the router or end a turn. Only the model's
sampled ids and the protocol's own framing may produce them: questions, schemas, evidence,
retrieved passages and SQL results are encoded as ordinary text (`plain_ids`), while the template
around them keeps its tags atomic. `Untrusted` marks such values inside a prompt; `encode_chat`
and `encode_text` honour the marks. Text whose marks yield no added-token id encodes exactly as
`tokenizer.encode` does.

Normalisers. A tokenizer matches an added token flagged `normalized=True` in the *normalised* text:
under NFKC the full-width "＜search＞" becomes "<search>" and so the tag's id, though the raw text holds
no tag. So the rule is checked on the ids, not the text: `encode_text` encodes with offsets and
falls back to `split_encode` when any added-token id comes from characters inside an untrusted span,
whatever normaliser, pre-tokenizer or token flags produced it; and `plain_ids` never returns an
added-token id (`forbidden_ids`; a piece the model itself would encode as one is re-encoded character
by character). Both tokenizer families load as `tokenizers`-backed tokenizers (a GGUF's vocabulary is converted to
one by transformers), so the same rule holds for an HF directory and a GGUF file.

Invalid text. A str may hold code points UTF-8 cannot encode (lone surrogates: valid JSON carries
them as "\\ud800"), which the tokenizer refuses with a TypeError. `encode_text` (and so
`encode_chat` and every observation) encodes each as U+FFFD (`data.text.valid_text`), one code point
for one so the untrusted spans still hold, and logs how many it replaced; valid text is untouched.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import re
import shutil
import tempfile
import uuid
from collections.abc import Sequence

import transformers

from dart_jax.data.paths import cache_root, file_key
from dart_jax.data.text import valid_text
from dart_jax.models.names import is_gguf, resolve

log = logging.getLogger(__name__)


def load_tokenizer(name_or_path: str):
    path = resolve(name_or_path)
    if is_gguf(path):
        return _gguf_tokenizer(path)
    if not os.path.isdir(path):
        raise ValueError(f"{path}: expected an HF model directory or a .gguf file")
    return transformers.AutoTokenizer.from_pretrained(path)


def converted_dir(gguf_path: str) -> str:
    """Where the HF tokenizer converted from a GGUF file is kept: under the cache root, keyed by the file
    (`file_key`) and the transformers / tokenizers versions that converted it."""
    import tokenizers
    key = f"{file_key(gguf_path)}|{transformers.__version__}|{tokenizers.__version__}"
    name = os.path.splitext(os.path.basename(os.path.realpath(gguf_path)))[0]
    return os.path.join(cache_root(), "tokenizers", f"{name}-{hashlib.sha1(key.encode()).hexdigest()[:16]}")


# what the conversion sets that save_pretrained does not write (transformers 5: the GGUF's add_bos / add_eos
# flags, and whether setting them rebuilds the post-processor); kept beside the copy, written last
KEPT_FLAGS = ("_add_bos_token", "_add_eos_token", "_should_update_post_processor")
FLAGS_FILE = "dart_jax_flags.json"


def _discard(path: str) -> None:
    """Remove a kept copy that does not load: moved aside first (one rename), so a reader sees it whole or not."""
    aside = f"{path}.bad{uuid.uuid4().hex}"
    try:
        os.replace(path, aside)
    except OSError:
        return  # gone already (another process discarded or replaced it)
    shutil.rmtree(aside, ignore_errors=True)


def _gguf_tokenizer(path: str):
    """A GGUF file's tokenizer. transformers converts it from the file's metadata (~4 s of parsing on this
    project's 2-core host, at every load); the converted tokenizer is kept once (`converted_dir`: written in a
    temporary folder and renamed into place, so whole or not at all; a copy another process kept first stays)
    and loaded from there after (~0.3 s), the same as the conversion (tested: the tokenizer JSON, added and
    special tokens, chat template, flags, ids). A copy that does not load is converted again; where the cache
    cannot be written the conversion is used as it is."""
    out = converted_dir(path)
    flags_path = os.path.join(out, FLAGS_FILE)
    if os.path.isfile(flags_path):
        try:
            tok = transformers.AutoTokenizer.from_pretrained(out)
            with open(flags_path) as f:
                for k, v in json.load(f).items():
                    object.__setattr__(tok, k, v)  # as the conversion set them (no post-processor rebuild)
            return tok
        except (OSError, ValueError) as e:
            log.warning("tokenizer: the converted copy in %s does not load (%s): converting %s again", out, e, path)
            _discard(out)
    tok = transformers.AutoTokenizer.from_pretrained(os.path.dirname(os.path.abspath(path)),
                                                     gguf_file=os.path.basename(path))
    tmp = None
    try:
        os.makedirs(os.path.dirname(out), exist_ok=True)
        tmp = tempfile.mkdtemp(dir=os.path.dirname(out), prefix=os.path.basename(out) + ".tmp")
        tok.save_pretrained(tmp)
        with open(os.path.join(tmp, FLAGS_FILE), "w") as f:
            json.dump({k: getattr(tok, k) for k in KEPT_FLAGS if hasattr(tok, k)}, f)
        if os.path.isdir(out) and not os.path.isfile(flags_path):  # a copy without its flags: not whole
            _discard(out)
        os.replace(tmp, out)  # fails where another process's whole copy is already there: that one is kept
    except OSError as e:
        log.debug("tokenizer: not kept in %s (%s)", out, e)
    finally:
        if tmp is not None:
            shutil.rmtree(tmp, ignore_errors=True)
    return tok


_MARK = re.compile("\ue000(\\d+)\ue001")


class Untrusted:
    """Collects untrusted values while a prompt is built: `mark(value)` returns a placeholder
    (private-use characters) to format into the prompt; `resolve(text)` puts the values back and
    returns their character spans."""

    def __init__(self):
        self.values: list[str] = []

    def __call__(self, value: str) -> str:
        self.values.append(str(value))
        return f"\ue000{len(self.values) - 1}\ue001"

    def resolve(self, text: str) -> tuple[str, list[tuple[int, int]]]:
        out, spans, pos = [], [], 0
        for m in _MARK.finditer(text):
            out.append(text[pos:m.start()])
            start = sum(map(len, out))
            value = self.values[int(m.group(1))]
            out.append(value)
            spans.append((start, start + len(value)))
            pos = m.end()
        out.append(text[pos:])
        return "".join(out), spans


def plain_ids(tokenizer, text: str) -> list[int]:
    """`text` as ordinary text: the tokenizer's normalizer, pre-tokenizer and model, with no added
    token (sentinel tag, chat marker) matched. Equals `tokenizer.encode(text)` for text holding none.
    Never an added-token id: a piece the model would encode as one (a vocabulary that also holds the
    added token, as a GGUF's does) is encoded character by character instead."""
    bt = tokenizer.backend_tokenizer
    if bt.normalizer is not None:
        text = bt.normalizer.normalize_str(text)
    pieces = bt.pre_tokenizer.pre_tokenize_str(text) if bt.pre_tokenizer is not None else [(text, None)]
    forbidden = forbidden_ids(tokenizer)
    out = []
    for piece, _ in pieces:
        ids = [t.id for t in bt.model.tokenize(piece)]
        if forbidden.intersection(ids):
            ids = [t.id for ch in piece for t in bt.model.tokenize(ch)]
            if forbidden.intersection(ids):  # a single character the vocabulary holds only as an added token
                log.warning("dropped %d added-token ids the tokenizer's model gives for the characters of %r",
                            sum(i in forbidden for i in ids), piece)
                ids = [i for i in ids if i not in forbidden]
        out += ids
    return out


def forbidden_ids(tokenizer) -> set[int]:
    """Ids that ordinary text must never produce: every added token's (sentinel tags, chat markers,
    special tokens) except the unknown token's, which stands for text the vocabulary cannot spell."""
    return set(_added_pattern(tokenizer)[1].values()) - {tokenizer.unk_token_id}


def _added_pattern(tokenizer) -> tuple[re.Pattern, dict[str, int]]:
    """A regex over the added tokens (leftmost-longest, as the tokenizer matches them) and their ids,
    cached on the tokenizer and rebuilt when tokens are added (`add_sentinel_tokens` after loading)."""
    size = len(tokenizer)
    cached = getattr(tokenizer, "_dart_jax_added", None)
    if cached is None or cached[0] != size:
        vocab = {t: int(i) for t, i in tokenizer.get_added_vocab().items()}
        pattern = re.compile("|".join(re.escape(t) for t in sorted(vocab, key=len, reverse=True)))
        cached = (size, pattern, vocab)
        tokenizer._dart_jax_added = cached
    return cached[1], cached[2]


def split_encode(tokenizer, text: str, spans: Sequence[tuple[int, int]] = ()) -> list[int]:
    """Ids of `text`: added tokens outside `spans` stay atomic, text between them (and every added
    token inside a span) is `plain_ids`. With no spans this is the tokenizer's own encoding."""
    pattern, vocab = _added_pattern(tokenizer)
    out, pos = [], 0
    for m in pattern.finditer(text) if vocab else ():
        if any(a < m.end() and m.start() < b for a, b in spans):
            continue
        out += plain_ids(tokenizer, text[pos:m.start()])
        out.append(vocab[m.group()])
        pos = m.end()
    return out + plain_ids(tokenizer, text[pos:])


def encode_text(tokenizer, text: str, spans: Sequence[tuple[int, int]] = ()) -> list[int]:
    """`tokenizer.encode(text)` unless the tokenizer turns characters inside one of the untrusted
    `spans` into an added-token id; then the text is encoded with every span as ordinary text
    (`split_encode`). The check is on the ids and their character offsets, so an added token matched
    only after normalisation (NFKC: "＜search＞" → "<search>") counts too (module doc). Code points
    UTF-8 cannot encode (lone surrogates) are encoded as U+FFFD and counted in a warning."""
    text, replaced = valid_text(text)
    if replaced:
        log.warning("%d invalid code points (lone surrogates) in text to encode replaced by U+FFFD", replaced)
    if not spans:
        return [int(i) for i in tokenizer.encode(text, add_special_tokens=False)]
    forbidden = forbidden_ids(tokenizer)
    enc = tokenizer(text, add_special_tokens=False, return_offsets_mapping=True)
    ids = [int(i) for i in enc["input_ids"]]
    inside = lambda s, e: any(a < e and s < b for a, b in spans)  # noqa: E731
    if not any(i in forbidden and inside(s, e) for i, (s, e) in zip(ids, enc["offset_mapping"])):
        return ids
    return split_encode(tokenizer, text, spans)


def render_chat(tokenizer, messages: list[dict], add_generation_prompt: bool = True) -> str:
    if not getattr(tokenizer, "chat_template", None):
        raise ValueError("this tokenizer has no chat template")
    return tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=add_generation_prompt)


def encode_chat(tokenizer, messages: list[dict], add_generation_prompt: bool = True,
                untrusted: Untrusted | None = None) -> list[int]:
    """Token ids of `messages` rendered by the tokenizer's own chat template; values marked with
    `untrusted` (placeholders in the message contents) are encoded as ordinary text."""
    text = render_chat(tokenizer, messages, add_generation_prompt)
    text, spans = untrusted.resolve(text) if untrusted is not None else (text, [])
    return encode_text(tokenizer, text, spans)


def stop_ids(tokenizer, cfg_eos: tuple[int, ...] = ()) -> tuple[int, ...]:
    """EOS / end-of-turn ids: the config's, the tokenizer's eos, and <|im_end|> / <|eot_id|>."""
    ids = set(cfg_eos)
    if tokenizer.eos_token_id is not None:
        ids.add(int(tokenizer.eos_token_id))
    for tok in ("<|im_end|>", "<|eot_id|>", "<|endoftext|>"):
        tid = tokenizer.convert_tokens_to_ids(tok)
        if isinstance(tid, int) and tid != tokenizer.unk_token_id and tid is not None:
            ids.add(tid)
    return tuple(sorted(ids))
