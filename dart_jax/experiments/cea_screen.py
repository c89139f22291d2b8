"""CEA's screen: choose identifiable questions before the expensive sample.

With `cea.screen` = {limit, n_samples, seed, lo, hi[, max_limit]} (n_samples > 0), the screen stage samples
M_Base `n_samples` times (at the study's temperature, with its own seed, which must not be `cea.seed` plus a
multiple of `cea.batch`: the sample stage's draws are then not the ones the selection was made on) on
the first `limit` questions of each set, and keeps the questions whose screen accuracy lies in [lo, hi]
(file order; e.g. 1/8 ≤ acc ≤ 7/8: questions M_Base always or never answers are the ones whose β the
clip, not the data, decides). With `max_limit`, while any set keeps fewer than `cea.limit` questions,
every set's pool grows by `limit` questions (the questions already screened are reused: eval.resume), up
to `max_limit`: a rule fixed before the screen, so how many questions are screened depends on M_Base
alone, never on a trained variant (selected.json holds the rule's smallest pool that keeps enough, whatever
screen/ held before). The sample stage then samples every variant on the kept questions only
(`cea.limit` takes the first N of them). screen/ holds the screen's evaluation and selected.json (the
rule, the pool, the kept ids); a changed rule, pool or rollout setting screens again, and a sample made
on another selection (any change to the kept ids, also beyond the first `cea.limit`) is sampled again
(its results record the selection's digest: eval.job's setup["selected"]).
"""

from __future__ import annotations

import dataclasses
import json
import logging
import os
import time

log = logging.getLogger(__name__)


def screen_config(c):
    """`cea.screen` when it asks for a screen (n_samples > 0), else None; checked."""
    sc = c.get("screen")
    if not sc or int(sc.get("n_samples", 0) or 0) <= 0:
        return None
    # a batch's sampling seed is seed + (a constant per set) + the batch's first row, and batches start at
    # multiples of cea.batch: seeds a multiple of the batch apart would share draws
    if (int(sc.seed) - int(c.seed)) % int(c.batch) == 0:
        raise ValueError(f"config.cea.screen.seed = {sc.seed} with cea.seed = {c.seed} and cea.batch = {c.batch}: "
                         "the screen would select questions on the very draws the sample stage then scores; give "
                         "the screen its own seed (not cea.seed plus a multiple of cea.batch)")
    if int(sc.n_samples) < 2 or not 0.0 <= float(sc.lo) <= float(sc.hi) <= 1.0:
        raise ValueError(f"config.cea.screen = {dict(sc)}: needs n_samples >= 2 and 0 <= lo <= hi <= 1")
    if sc.get("max_limit") and (not sc.get("limit") or int(sc.max_limit) < int(sc.limit)):
        raise ValueError(f"config.cea.screen = {dict(sc)}: max_limit grows the pool by `limit` questions at a "
                         "time: it needs limit set and max_limit >= limit")
    return sc


def _setup(st, sc) -> dict:
    setup = {"datasets": sorted(st.c.datasets), "limit": int(sc.limit) if sc.get("limit") else None,
             "n_samples": int(sc.n_samples), "seed": int(sc.seed), "temperature": float(st.c.temperature),
             "batch": int(st.c.batch),
             "lo": float(sc.lo), "hi": float(sc.hi), "model": st.config.model.path, "warm_start": st.config.warm_start}
    if sc.get("max_limit"):  # the growing pool's rule (absent: a fixed pool, as selections made before it)
        setup.update(max_limit=int(sc.max_limit), want=int(st.c.limit) if st.c.limit else None)
    return setup


def pools(setup: dict, screened: int = 0) -> list[int | None]:
    """The pool sizes the screen may sample, in turn: `limit`, then up to `max_limit` in steps of `limit`;
    those below the pool that holds the `screened` questions an earlier run of the rule sampled are
    skipped (an evaluation asked for fewer questions than its directory holds would drop the rest)."""
    if not setup.get("max_limit") or not setup.get("want"):
        return [setup["limit"]]
    every = list(range(setup["limit"], setup["max_limit"], setup["limit"])) + [setup["max_limit"]]
    return [p for p in every if p >= screened] or every[-1:]


def _screened(out: str, n_samples: int) -> int:
    """Questions of a set an earlier screen in `out` sampled (the largest set's count, a partial one included);
    0 where its records are not of `n_samples` samples a question. Only where the screen starts: the
    selection itself is the same whatever `out` held (`_smallest_pool`)."""
    from dart_jax.eval.resume import RECORDS, read_records
    path = os.path.join(out, RECORDS)
    if not os.path.isfile(path):
        return 0
    counts: dict[str, int] = {}
    samples = set()
    for r in read_records(path):
        counts[r["dataset"]] = counts.get(r["dataset"], 0) + 1
        samples.add(int(r["sample"]))
    if samples and max(samples) != n_samples - 1:
        return 0
    return -(-max(counts.values(), default=0) // n_samples)


def _path(st) -> str:
    return os.path.join(st.out, "screen", "selected.json")


def read_selection(st) -> dict | None:
    """selected.json when it was made by this config's screen (None: no screen asked; FileNotFoundError /
    ValueError: not screened yet, or screened differently)."""
    sc = screen_config(st.c)
    if sc is None:
        return None
    if not os.path.isfile(_path(st)):
        raise FileNotFoundError(f"CEA: cea.screen is set but {_path(st)} is missing (run the screen stage first)")
    with open(_path(st)) as f:
        sel = json.load(f)
    if sel["setup"] != _setup(st, sc):
        raise ValueError(f"CEA: {_path(st)} was screened with {sel['setup']}, the config asks {_setup(st, sc)} "
                         "(run the screen stage again)")
    return sel


def screen_stage(st) -> dict | None:
    """Screen M_Base and write selected.json. The evaluation always runs: when screen/ already holds one with
    the same setup (every rollout, retriever and sampling setting: eval.resume's fingerprint) it reuses
    every batch, so a changed setting is screened again and never read from the old selection."""
    from dart_jax.eval.job import evaluate
    from dart_jax.eval.runner import EvalOptions
    from dart_jax.parallel.distributed import from_main, on_main
    sc = screen_config(st.c)
    if sc is None:
        log.info("CEA screen: cea.screen is not set: every question is sampled")
        return None
    want = _setup(st, sc)
    out = os.path.join(st.out, "screen")
    t0, sampled = time.perf_counter(), False
    todo = pools(want, from_main(_screened, out, int(sc.n_samples)))
    for limit in todo:
        options = EvalOptions(n_samples=int(sc.n_samples), temperature=float(st.c.temperature),
                              batch=int(st.c.batch), seed=int(sc.seed), limit=limit, progress=True)
        results = evaluate(st.config, out, list(st.c.datasets), options)
        sel = from_main(_smallest_pool, out, want, limit)
        sampled |= sum(results["setup"].get("resumed", {}).values()) < sum(sel["pool"].values()) * int(sc.n_samples)
        kept = {d: len(v) for d, v in sel["selected"].items()}
        short = {d: k for d, k in kept.items() if st.c.limit and k < int(st.c.limit)}
        if not short or limit == todo[-1] or all(sel["pool"][d] < limit for d in short):  # no more questions
            break
        log.info("CEA screen: pools of %s questions keep %s, fewer than cea.limit = %s: screening the next %d",
                 sel["pool"], kept, st.c.limit, int(sc.limit))
    empty = [d for d, k in kept.items() if not k]
    if empty:
        raise ValueError(f"CEA screen: no question of {empty} has M_Base accuracy in [{want['lo']}, {want['hi']}] "
                         f"over {want['n_samples']} samples among the {sel['pool']} screened: widen the rule or the "
                         "pool (cea.screen.limit, max_limit)")
    on_main(_write, _path(st), sel)
    if short:
        log.warning("CEA screen: %s kept fewer questions than cea.limit = %s: the sample stage samples those", short,
                    st.c.limit)
    if sampled:
        st._record("screen", "base", time.perf_counter() - t0, kept=kept)
    log.info("CEA screen: %s keeps %s of %s", _path(st), kept, sel["pool"])
    return sel


def _select(out: str, setup: dict, limit: int | None = None) -> dict:
    """The kept questions among the first `limit` of each set screened in `out` (None: all of them)."""
    with open(os.path.join(out, "per_question_accuracy.jsonl")) as f:
        rows = [json.loads(line) for line in f if line.strip()]
    selected, pool = {d: [] for d in setup["datasets"]}, {d: 0 for d in setup["datasets"]}
    for r in rows:
        if limit is not None and pool[r["dataset"]] >= limit:
            continue
        pool[r["dataset"]] += 1
        if setup["lo"] <= r["correct"] / r["n"] <= setup["hi"]:
            selected[r["dataset"]].append(str(r["id"]))
    return {"setup": setup, "pool": pool, "selected": selected}


def _smallest_pool(out: str, setup: dict, limit: int | None) -> dict:
    """The selection of the rule's smallest pool (≤ `limit`, the questions evaluated) in which every set keeps
    `want` questions, else of all `limit`: the same whether the screen stopped there or `out` held more."""
    for p in pools(setup):
        if p is not None and limit is not None and p < limit:
            sel = _select(out, setup, p)
            if all(len(v) >= setup["want"] for v in sel["selected"].values()):
                return sel
    return _select(out, setup, limit)


def _write(path: str, sel: dict) -> None:
    tmp = path + ".tmp"
    with open(tmp, "w") as f:
        json.dump(sel, f, indent=1)
    os.replace(tmp, path)


def sample_sets(st) -> list:
    """The sample stage's sets: the configured names, or with a screen the sets narrowed to its kept ids."""
    from dart_jax.eval.datasets import EVAL_SETS
    from dart_jax.parallel.distributed import from_main
    sel = from_main(read_selection, st)
    if sel is None:
        return list(st.c.datasets)
    return [dataclasses.replace(EVAL_SETS[d], ids=tuple(sel["selected"][d])) for d in st.c.datasets]


def selection_digests(st) -> dict | None:
    """What eval.job records as setup["selected"] for the sample stage's sets (None without a screen)."""
    from dart_jax.eval.datasets import ids_digest
    if screen_config(st.c) is None:
        return None
    try:
        sel = read_selection(st)
    except (FileNotFoundError, ValueError):
        return {"screen": "missing or stale"}  # never equal to a recorded selection
    return {d: ids_digest(sel["selected"][d]) for d in st.c.datasets}


def lab_cells(datasets) -> dict:
    """{"<set>/<question id>": "h<hops>/<op>"} for the lab sets among `datasets` (CEA's per-cell β23)."""
    from dart_jax.eval.datasets import EVAL_SETS, load_set
    cells = {}
    for d in datasets:
        s = EVAL_SETS.get(d)
        if s is None or s.group != "lab":
            continue
        rows, _ = load_set(s)
        cells.update({f"{d}/{r['id']}": f"h{r['lab']['hops']}/{r['lab']['op']}" for r in rows})
    return cells
