"""Search-R1 corpora: reading them, looking passages up by byte offset, and the embedded corpus.

Corpus rows are Search-R1's `{"id", "contents": "\"Title\"\ntext"}`, one JSON object a line; a
passage's faiss id is its row number. `CorpusFile` looks rows up through a table of byte offsets
(one uint64 per passage, memory-mapped), so a 21M-passage wiki-18 never becomes Python objects.

The embedded corpus and QA slices are built from the benchmark data in ../shared/data. Sources (all
Wikipedia, CC BY-SA): the FlashRAG wiki-18 sample (1000 passages), the gold NQ-open passage of each
of the 2655 questions in nq-open-oracle, and the 10 paragraphs of each of 300 HotpotQA
dev-distractor questions. The QA slices keep exactly the questions whose evidence is in the corpus.
"""

from __future__ import annotations

import gzip
import hashlib
import json
import os
from typing import Iterable, Iterator

import numpy as np

from dart_jax.errors import UserError

_CHUNK = 64 << 20  # bytes read per step of the offset scan


def read_jsonl(path: str) -> Iterator[dict]:
    opener = gzip.open if path.endswith(".gz") else open
    with opener(path, "rt", encoding="utf-8") as f:
        for n, line in enumerate(f, 1):
            if line.strip():
                try:
                    yield json.loads(line)
                except json.JSONDecodeError as e:
                    raise ValueError(f"{path}:{n}: invalid JSON ({e})") from None


def write_jsonl(path: str, rows: Iterable[dict]) -> int:
    os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
    n = 0
    with open(path, "w", encoding="utf-8") as f:
        for r in rows:
            f.write(json.dumps(r, ensure_ascii=False) + "\n")
            n += 1
    return n


def read_corpus(path: str) -> list[dict]:
    rows = list(read_jsonl(path))
    for i, r in enumerate(rows):
        if "contents" not in r or "id" not in r:
            raise ValueError(f"{path}: row {i + 1} lacks 'id' or 'contents' (Search-R1 corpus format)")
    return rows


def line_offsets(path: str) -> np.ndarray:
    """u64[N]: the byte offset of each non-blank line of `path`, in one streaming pass (64 MiB at a
    time, newlines found by numpy), so a 13 GB wiki-18 is scanned in seconds without holding it."""
    if path.endswith(".gz"):
        raise UserError(f"{path}: passages are looked up by byte offset, which a gzip file has not; "
                        f"decompress it first (gunzip -k {path})")
    starts, ends = [], []
    base, pending = 0, 0  # pending: where the line that is still open began
    with open(path, "rb") as f:
        while chunk := f.read(_CHUNK):
            nl = np.flatnonzero(np.frombuffer(chunk, np.uint8) == 10).astype(np.uint64) + np.uint64(base)
            if len(nl):
                starts.append(np.concatenate([[pending], nl[:-1] + 1]).astype(np.uint64))
                ends.append(nl)
                pending = int(nl[-1]) + 1
            base += len(chunk)
    if pending < base:  # a last line without a newline
        starts.append(np.array([pending], np.uint64))
        ends.append(np.array([base], np.uint64))
    if not starts:
        return np.zeros(0, np.uint64)
    start, end = np.concatenate(starts), np.concatenate(ends)
    keep = end - start > 2  # a JSON row takes at least 2 bytes; shorter lines are read to see if blank
    with open(path, "rb") as f:
        for i in np.flatnonzero(~keep):
            f.seek(int(start[i]))
            keep[i] = bool(f.read(int(end[i] - start[i])).strip())
    return start[keep]


class CorpusFile:
    """Rows of a Search-R1 corpus by row number: `corpus[i]` reads line i at its byte offset
    (`os.pread`, safe from many threads) and parses that one line. Resident memory is the pages of
    the offset table and the file that searches touch, not the corpus."""

    def __init__(self, path: str, offsets_path: str):
        self.path = path
        self.offsets = np.load(offsets_path, mmap_mode="r")
        self.size = os.path.getsize(path)
        self._fd = os.open(path, os.O_RDONLY)

    def __len__(self) -> int:
        return len(self.offsets)

    def __getitem__(self, i: int) -> dict:
        i = int(i)
        if not 0 <= i < len(self.offsets):
            raise IndexError(f"{self.path}: row {i} of {len(self.offsets)}")
        start = int(self.offsets[i])
        end = int(self.offsets[i + 1]) if i + 1 < len(self.offsets) else self.size
        raw = os.pread(self._fd, end - start, start)
        try:
            row = json.loads(raw)
        except (json.JSONDecodeError, UnicodeDecodeError) as e:
            raise ValueError(f"{self.path}: row {i + 1} (byte {start}) is not a JSON object ({e}); the offset "
                             "table does not match the file: rebuild the index directory") from None
        if not isinstance(row, dict) or "contents" not in row:
            raise ValueError(f"{self.path}: row {i + 1} lacks 'contents' (Search-R1 corpus format)")
        return row

    def close(self) -> None:
        if self._fd >= 0:
            os.close(self._fd)
            self._fd = -1


def _contents(title: str, text: str) -> str:
    return f"\"{title}\"\n{text.strip()}"


def build_from_shared(shared_data: str) -> tuple[list[dict], list[dict], list[dict]]:
    """-> (corpus, nq questions, hotpotqa questions); questions in FlashRAG format with `id`,
    `question`, `golden_answers`, `data_source`."""
    corpus, seen = [], set()

    def add(contents: str, source: str):
        key = hashlib.sha1(contents.encode()).hexdigest()
        if key not in seen:
            seen.add(key)
            corpus.append({"id": f"{source}-{len(corpus)}", "contents": contents})

    for r in read_jsonl(os.path.join(shared_data, "wiki", "wiki18_flashrag_sample1000.jsonl")):
        add(r["contents"], "wiki18")
    nq = []
    for i, r in enumerate(read_jsonl(os.path.join(shared_data, "qa", "nq_open", "nq-open-oracle.jsonl.gz"))):
        gold = [c for c in r["ctxs"] if c.get("isgold")] or r["ctxs"][:1]
        for c in gold:
            add(_contents(c["title"], c["text"]), "nq")
        nq.append({"id": f"nq-oracle-{i}", "question": r["question"], "golden_answers": list(r["answers"]),
                   "data_source": "nq"})
    hotpot = []
    for r in read_jsonl(os.path.join(shared_data, "qa", "hotpotqa", "dev_distractor_sample300.jsonl")):
        for title, sents in zip(r["context"]["title"], r["context"]["sentences"]):
            add(_contents(title, "".join(sents)), "hotpotqa")
        hotpot.append({"id": f"hotpotqa-{r['id']}", "question": r["question"], "golden_answers": [r["answer"]],
                       "data_source": "hotpotqa"})
    return corpus, nq, hotpot
