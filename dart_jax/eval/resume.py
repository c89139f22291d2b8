"""Resuming an evaluation in its output directory: an interrupted run continues, and a run asked for
more questions (a larger `limit`) samples only the new ones.

Exactness: the evaluator cuts each set's (question, sample) items into batches of `batch` from the
first item and seeds every batch by (seed, set, first item); the sampler keys each draw by (seed,
row, position). A batch therefore yields the same trajectories whenever its items, its size and the
settings that shape a rollout are the same — so a batch of an earlier run is reused only when the
earlier run's setup (everything but `limit`, the wall time and the printed comparisons) matches,
the batch covers the same items in the same order, and it had the same size in both runs (a last,
shorter batch of a smaller run is sampled again at its full size). Reuse stops at the first batch
that does not qualify, so a set's records stay in item order.

`progress.json` (written before sampling) holds the fingerprint of the setup, the batch size and
each set's planned number of items; a finished run's `results.json` serves when it is absent.
"""

from __future__ import annotations

import json
import logging
import os

log = logging.getLogger(__name__)

PROGRESS = "progress.json"
RECORDS = "per_question.jsonl"
# setup keys that do not shape a trajectory (a batch is the same batch on any number of processes;
# the architecture follows from the stamped model files, the as-trained notes from the other settings)
# "corpora" (what each set with its own corpus was searched over) is compared per set, not for the whole run
VOLATILE = ("seconds", "compare", "limit", "resumed", "processes", "architecture", "as_trained", "corpora")
LAYOUT_MODEL = ("cache_block",)  # model settings that change how attention reads the cache, not what it computes
SUMMARIES = ("results.json", "results.md", "results.csv", "per_question_accuracy.jsonl")
PATH_KEYS = ("checkpoint", "adapters", "peft", "warm_start", "model")


def fingerprint(setup: dict) -> dict:
    """The part of an evaluation's setup that determines its trajectories, JSON-normalised."""
    fp = {k: v for k, v in setup.items() if k not in VOLATILE}
    if isinstance(fp.get("model_config"), dict):
        fp["model_config"] = {k: v for k, v in fp["model_config"].items() if k not in LAYOUT_MODEL}
    return json.loads(json.dumps(fp, default=str))


def _read_json(path: str) -> dict | None:
    try:
        with open(path) as f:
            return json.load(f)
    except (OSError, ValueError):
        return None


def searched(setup: dict) -> dict:
    """{set: what it was searched over} for the sets with their own corpus (job.searched_over), JSON-normalised;
    a set absent was searched with the run's retriever (or the run's fixed retrieval, or is SQL)."""
    return json.loads(json.dumps(setup.get("corpora") or {}, default=str))


def _plan(out_dir: str) -> tuple[dict, int, dict, dict] | None:
    """(fingerprint, batch, {set: planned items}, {set: searched over}) of the run that wrote out_dir, if it says."""
    p = _read_json(os.path.join(out_dir, PROGRESS))
    if p and {"fingerprint", "batch", "items"} <= p.keys():
        return (p["fingerprint"], int(p["batch"]), {k: int(v) for k, v in p["items"].items()},
                p.get("searched") or {})
    r = _read_json(os.path.join(out_dir, "results.json"))  # finished before progress.json existed
    if r and "setup" in r and r["setup"].get("batch"):
        return (fingerprint(r["setup"]), int(r["setup"]["batch"]),
                {k: int(v["trajectories"]) for k, v in r.get("datasets", {}).items()}, searched(r["setup"]))
    return None


def read_records(path: str) -> list[dict]:
    """The records of a per_question.jsonl; a last line cut short by an interrupted write is dropped."""
    recs = []
    with open(path) as f:
        lines = f.read().split("\n")
    for k, line in enumerate(lines):
        if not line.strip():
            continue
        try:
            recs.append(json.loads(line))
        except ValueError:
            if any(x.strip() for x in lines[k + 1:]):
                raise ValueError(f"{path}: line {k + 1} is not JSON (and is not the last line)") from None
            log.warning("%s: dropping a last line cut short (%d characters)", path, len(line))
    return recs


def prior(out_dir: str, setup: dict, batch: int) -> dict[str, tuple[int, list[dict]]]:
    """{set: (items the earlier run planned, its records in order)} when out_dir holds an evaluation with
    the same fingerprint and batch size; {} otherwise (the reason is logged)."""
    path = os.path.join(out_dir, RECORDS)
    if not os.path.isfile(path):
        return {}
    plan = _plan(out_dir)
    if plan is None:
        log.info("evaluate: %s has no progress.json or results.json with a batch size; sampling afresh", out_dir)
        return {}
    fp, old_batch, planned, old_searched = plan
    mine = fingerprint(setup)
    if old_batch != batch or fp != mine:
        diff = sorted(k for k in fp.keys() | mine.keys() if fp.get(k) != mine.get(k))
        log.info("evaluate: %s was sampled with other settings (%s); sampling afresh", out_dir,
                 ", ".join(diff + (["batch"] if old_batch != batch else [])))
        return {}
    by_set: dict[str, list[dict]] = {}
    for r in read_records(path):
        by_set.setdefault(r["dataset"], []).append(r)
    now = searched(setup)
    other = sorted(s for s in by_set if old_searched.get(s) != now.get(s))
    if other:  # a set searched over another corpus (or another copy of it) is sampled afresh, the rest reused
        log.info("evaluate: %s in %s were searched over another corpus; sampling them afresh", ", ".join(other),
                 out_dir)
    return {s: (planned[s], recs) for s, recs in by_set.items() if s in planned and s not in other}


def reusable(items: list[tuple[dict, int]], earlier: tuple[int, list[dict]] | None, batch: int) -> list[dict]:
    """The earlier records that this run's batches would reproduce: the longest prefix of whole batches
    with the same items, in the same order, of the same size in both runs."""
    if not earlier:
        return []
    n_old, recs = earlier
    n_new, kept = len(items), 0
    for start in range(0, n_new, batch):
        stop = min(start + batch, n_new)
        if min(start + batch, n_old) != stop or len(recs) < stop:
            break
        if any((recs[i]["id"], recs[i]["sample"]) != (items[i][0]["id"], items[i][1]) for i in range(start, stop)):
            break
        kept = stop
    return recs[:kept]


def write_progress(out_dir: str, setup: dict, batch: int, items: dict[str, int]) -> None:
    tmp = os.path.join(out_dir, PROGRESS + ".tmp")
    with open(tmp, "w") as f:
        json.dump({"fingerprint": fingerprint(setup), "batch": batch, "items": items, "searched": searched(setup)},
                  f, indent=1)
    os.replace(tmp, os.path.join(out_dir, PROGRESS))


def write_records(path: str, recs: list[dict]) -> None:
    """Replace path by these records atomically (a crash leaves the old file or the new one)."""
    tmp = path + ".tmp"
    with open(tmp, "w") as f:
        for r in recs:
            f.write(json.dumps(r, ensure_ascii=False) + "\n")
    os.replace(tmp, path)


def clear_results(out_dir: str) -> None:
    """Remove an earlier run's summaries before the records are rewritten: until this run finishes,
    no results.json claims records it does not describe (launch.cea reads it to skip a sample)."""
    for name in SUMMARIES:
        path = os.path.join(out_dir, name)
        if os.path.isfile(path):
            os.remove(path)


def stamps(source: dict, *extra: str | None) -> dict:
    """{path: [files, bytes, newest mtime]} of the files a policy was loaded from (checkpoint, adapter,
    PEFT, warm-start directories, a fixed-retrieval file): a directory written again under the same
    name — adapters exported by later training — changes its stamp, so its samples are not reused."""
    paths = [source.get(k) for k in PATH_KEYS] + list(extra)
    out = {}
    for p in paths:
        if not p or not isinstance(p, str) or not os.path.exists(p):
            continue
        files = [p] if os.path.isfile(p) else [os.path.join(r, f) for r, _, fs in os.walk(p) for f in fs]
        st = [os.stat(f) for f in files if os.path.isfile(f)]
        out[p] = [len(st), sum(x.st_size for x in st), max((x.st_mtime_ns for x in st), default=0)]
    return out
