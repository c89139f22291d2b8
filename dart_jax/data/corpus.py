"""The embedded retrieval corpus and QA slices, built from the benchmark data in ../shared/data.

Corpus rows are Search-R1's `{"id", "contents": "\"Title\"\ntext"}`. Sources (all Wikipedia,
CC BY-SA): the FlashRAG wiki-18 sample (1000 passages), the gold NQ-open passage of each of the
2655 questions in nq-open-oracle, and the 10 paragraphs of each of 300 HotpotQA dev-distractor
questions. The QA slices keep exactly the questions whose evidence is in the corpus.
"""

from __future__ import annotations

import gzip
import hashlib
import json
import os
from typing import Iterable, Iterator


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
