"""A run's trajectory records: every trajectory of every step in `rollouts.jsonl`, as text pieces
(written: loss 1, observations: 0) with its score — the input of self-distillation
(`sft.demos.distill_demos`) and of fixed-retrieval replay (`eval.fixed`).

Reading a run's jsonl records (`rollouts.jsonl`, `metrics.jsonl`): a crash mid-write leaves a last line
cut short. Readers skip it (`read_records`); a resume sets it aside into `<name>.torn` beside the file
(`rewrite_records`) and keeps every complete record. A line that is not a record *followed by records*
is damage, not a cut-short write: `DamagedRecords`, one line naming the file and line. A file appended to
across starts (`provenance.jsonl`) is mended first (`mend_tail`), so a new record never joins a torn one."""

from __future__ import annotations

import gzip
import json
import logging
import os
import zlib
from typing import Callable, Iterator

import numpy as np

log = logging.getLogger(__name__)

ROLLOUTS = "rollouts.jsonl"
TORN = ".torn"  # suffix of the file beside a record file that holds its cut-short last lines


class DamagedRecords(ValueError):
    pass


def _record(raw: bytes) -> dict | None:
    try:
        rec = json.loads(raw)
    except (ValueError, RecursionError):  # JSONDecodeError, UnicodeDecodeError: a line cut short
        return None
    return rec if isinstance(rec, dict) else None


def _lines(f, path: str) -> Iterator[bytes]:
    """The lines of `f`; a .gz stream cut short (a crash while it was written) ends where its data ends,
    its last partial line then read as a torn tail."""
    try:
        yield from f
    except (EOFError, zlib.error, gzip.BadGzipFile) as e:
        log.warning("%s: the compressed stream is cut short (%s): reading the records before it", path, e)


def iter_records(path: str, tail: list[bytes] | None = None) -> Iterator[tuple[bytes, dict]]:
    """(line without its newline, record) of each complete record of a jsonl file, in order; blank lines
    skipped. A last line that is not a JSON object (a write cut short) is not yielded: its bytes go to
    `tail` when given. A line that is not one, with records after it: `DamagedRecords`."""
    pending = None  # (line number, bytes) of a line that did not parse: a torn tail if only blanks follow
    with (gzip.open(path, "rb") if path.endswith(".gz") else open(path, "rb")) as f:
        for n, raw in enumerate(_lines(f, path), 1):
            if not raw.strip():
                if pending is not None:
                    pending = (pending[0], pending[1] + raw)
                continue
            if pending is not None:
                raise DamagedRecords(f"{path}: line {pending[0]} is not a JSON record and records follow it (damage, "
                                     "not a write cut short): repair or remove that line, or move the file aside")
            rec = _record(raw)
            if rec is None:
                pending = (n, raw)
                continue
            yield raw.rstrip(b"\r\n"), rec
    if pending is not None and tail is not None:
        tail.append(pending[1])


def read_records(path: str) -> list[dict]:
    """The complete records of a jsonl record file; a cut-short last line is skipped (logged)."""
    tail: list[bytes] = []
    out = [rec for _, rec in iter_records(path, tail)]
    if tail:
        log.warning("%s: skipped its last line, a record cut short (%d bytes)", path, len(tail[0]))
    return out


def rewrite_records(path: str, keep: Callable[[dict], bool] = lambda rec: True) -> tuple[int, int]:
    """Rewrite `path` with its complete records that `keep` accepts (atomically: a temporary file
    replaces it). A cut-short last line is appended to `<path>.torn` and logged in one line.
    -> (records kept, records dropped)."""
    tail: list[bytes] = []
    kept = dropped = 0
    tmp = path + ".tmp"
    with open(tmp, "wb") as out:
        for raw, rec in iter_records(path, tail):
            if keep(rec):
                out.write(raw + b"\n")
                kept += 1
            else:
                dropped += 1
    if tail:
        with open(path + TORN, "ab") as f:
            f.write(tail[0].rstrip(b"\r\n") + b"\n")
        log.warning("%s: its last line is a record cut short (%d bytes, a crash mid-write): set aside in %s; "
                    "%d complete records kept", path, len(tail[0]), path + TORN, kept)
    os.replace(tmp, path)
    return kept, dropped


def mend_tail(path: str) -> None:
    """Before appending to jsonl record file `path`: a last line without its newline is a complete record
    (its newline is added) or one cut short by a crash (moved to `<path>.torn`, logged), so that the
    appended record starts a line of its own. Reads only the last line."""
    if not os.path.isfile(path) or not os.path.getsize(path):
        return
    with open(path, "rb+") as f:
        f.seek(-1, os.SEEK_END)
        if f.read(1) == b"\n":
            return
        pos = start = f.tell()
        while pos > 0:
            size = min(1 << 16, pos)
            pos -= size
            f.seek(pos)
            cut = f.read(size).rfind(b"\n")
            if cut >= 0:
                start = pos + cut + 1
                break
            start = pos
        f.seek(start)
        last = f.read()
        if not last.strip() or _record(last) is not None:
            f.seek(0, os.SEEK_END)
            f.write(b"\n")
            return
        with open(path + TORN, "ab") as torn:
            torn.write(last.rstrip(b"\r\n") + b"\n")
        f.truncate(start)
    log.warning("%s: its last line is a record cut short (%d bytes, a crash mid-write): set aside in %s before "
                "appending", path, len(last), path + TORN)


def append_record(path: str, record: dict) -> None:
    """Append one record to a jsonl file that outlives a process (`mend_tail` first)."""
    mend_tail(path)
    with open(path, "a") as f:
        f.write(json.dumps(record) + "\n")


def read_rollouts(path: str) -> list[dict]:
    """The trajectories of a run's rollouts.jsonl (a cut-short last line skipped)."""
    return read_records(path)


def append_rollouts(out_dir: str, step: int, tb, rows: list[dict], scores: np.ndarray, accuracy: np.ndarray,
                    valid: np.ndarray, task: str, tokenizer) -> str:
    """Append the trajectories of RL step `step` (1-based, as the metrics) to out_dir/rollouts.jsonl."""
    os.makedirs(out_dir, exist_ok=True)
    path = os.path.join(out_dir, ROLLOUTS)
    with open(path, "a") as f:
        for i, row in enumerate(rows):
            p, n = int(tb.prompt_len[i]), int(tb.length[i])
            ids, mask = tb.ids[i, p:n].tolist(), tb.loss_mask[i, p:n]
            pieces, start = [], 0
            for t in range(1, len(ids) + 1):
                if t == len(ids) or mask[t] != mask[start]:
                    pieces.append({"text": tokenizer.decode(ids[start:t], skip_special_tokens=False),
                                   "loss": int(mask[start] > 0)})
                    start = t
            rec = {"step": step, "uid": tb.uids[i], "data_source": row.get("data_source", "data"), "task": task,
                   "question": row["question"], "pieces": pieces, "score": float(scores[i]),
                   "accuracy": float(accuracy[i]), "finish": tb.finish_reason[i], "in_update": bool(valid[i])}
            for k in ("golden_answers", "db_path", "db_id", "query"):
                if k in row:
                    rec[k] = row[k]
            f.write(json.dumps(rec, ensure_ascii=False) + "\n")
    return path


def trim_rollouts(out_dir: str, step: int) -> None:
    """After a successful resume: keep only trajectories of steps ≤ `step` (drop what the interrupted
    run wrote past its checkpoint); a record cut short by a crash is set aside (`rewrite_records`)."""
    path = os.path.join(out_dir, ROLLOUTS)
    if not os.path.isfile(path):
        return
    rewrite_records(path, lambda rec: rec.get("step", 0) <= step)
