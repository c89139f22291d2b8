"""Passages read by byte offset (`data.corpus.CorpusFile`, what the retriever does) against the same
corpus held as Python objects (`read_corpus`), on a synthetic Search-R1 corpus of N short passages:
resident memory per million passages, the offset scan's rate and the look-up latency. wiki-18 is 21M
passages: held as dicts it would not fit a retrieval host's memory beside the 61 GiB of E5 vectors.
"""

from __future__ import annotations

import gc
import json
import os
import tempfile
import time

import numpy as np

from dart_jax.data.corpus import CorpusFile, line_offsets, read_corpus

WORDS = ("alpha", "river", "born", "city", "the", "of", "war", "king", "1912", "music", "island", "church")


def _rss_mib() -> dict[str, float]:
    """VmRSS / RssAnon / RssFile of this process in MiB (Linux /proc)."""
    out = {}
    with open("/proc/self/status") as f:
        for line in f:
            key, _, value = line.partition(":")
            if key in ("VmRSS", "RssAnon", "RssFile"):
                out[key] = int(value.split()[0]) / 1024
    return out


def write_synthetic(path: str, n: int, seed: int = 0) -> None:
    """n passages of 20 words each, Search-R1 rows {"id", "contents": "\\"Title\\"\\ntext"}."""
    rng = np.random.default_rng(seed)
    words = np.array(WORDS)
    with open(path, "w") as f:
        for i in range(n):
            text = " ".join(words[rng.integers(0, len(words), 20)])
            f.write(json.dumps({"id": str(i), "contents": f"\"Title {i}\"\n{text}"}) + "\n")


def bench_corpus(n: int = 1_000_000, lookups: int = 100_000, seed: int = 0) -> dict:
    with tempfile.TemporaryDirectory(prefix="dart_jax_corpus_") as tmp:
        path = os.path.join(tmp, "wiki-18.jsonl")
        write_synthetic(path, n, seed)
        size = os.path.getsize(path)
        t = time.perf_counter()
        offsets = line_offsets(path)
        scan_s = time.perf_counter() - t
        table = os.path.join(tmp, "offsets.npy")
        np.save(table, offsets)
        del offsets
        gc.collect()
        before = _rss_mib()
        corpus = CorpusFile(path, table)
        ids = np.random.default_rng(seed + 1).integers(0, n, lookups)
        t = time.perf_counter()
        for i in ids:
            corpus[int(i)]
        lookup_s = (time.perf_counter() - t) / lookups
        after = _rss_mib()
        corpus.close()
        del corpus
        gc.collect()
        base = _rss_mib()
        t = time.perf_counter()
        rows = read_corpus(path)
        held_s = time.perf_counter() - t
        held = _rss_mib()
        del rows
        per_million = 1e6 / n
        return {"passages": n, "corpus_mib": size / 2 ** 20, "scan_s": scan_s,
                "offsets_mib_per_million": os.path.getsize(table) / 2 ** 20 * per_million,
                "by_offset_rss_mib_per_million": (after["VmRSS"] - before["VmRSS"]) * per_million,
                "by_offset_anon_mib_per_million": (after["RssAnon"] - before["RssAnon"]) * per_million,
                "lookup_us": lookup_s * 1e6, "lookups": lookups,
                "as_objects_rss_mib_per_million": (held["VmRSS"] - base["VmRSS"]) * per_million,
                "as_objects_load_s": held_s}
