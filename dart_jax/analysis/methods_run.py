"""The method comparison (issue 19) as resumable stages over one output directory (`config.methods.out`):

    train/<method>_s<seed>/   one GRPO run per (method, seed): the config with only the method and the
                              seed changed (configs/methods_quickstart.apply_method); resumed from its
                              newest finished checkpoint, skipped once it reached train.steps; a
                              directory written by another configuration is refused, field by field
    eval/<method>_s<seed>/    greedy held-out evaluation of the run's last checkpoint (eval.job; an
                              interrupted evaluation continues: eval.resume)
    eval/warm_start/          the same evaluation of the policy every run starts from (the warm start,
                              no GRPO): the reference each run's gains and losses are paired against
                              (`methods.reference`)
    report/                   report.md, summary.json, results.csv, reward_curves.png (methods_report)
    stages.json               each stage's wall time and when it finished

`methods.archive` (a directory; "" for none) keeps what the report needs of every finished run, small
enough to commit, so the comparison survives the loss of `out` (a fresh clone, a new machine): each
run's train/<run>/metrics.jsonl, eval/<run>/results.json and per_question.jsonl.gz, and the stage
times. A run archived with a finished evaluation is neither trained nor evaluated again; the report
reads each run from `out` where it is there and from the archive otherwise. Every evaluation is
archived as soon as it finishes (and `--stage=archive` archives what `out` holds).
"""

from __future__ import annotations

import copy
import gzip
import json
import logging
import os
import shutil
import time

from dart_jax.analysis.stage_log import StageLog

log = logging.getLogger(__name__)

STAGES = ("train", "eval", "archive", "report")
REFERENCE = "warm_start"


def _methods(config):
    if "methods" not in config:
        raise ValueError("launch.methods needs a config with a `methods` section (configs/methods_quickstart.py)")
    return config.methods


def as_list(value) -> list[str]:
    """A config list: a comma-separated string (settable on the command line) or a sequence."""
    items = value.split(",") if isinstance(value, str) else list(value)
    return [str(x).strip() for x in items if str(x).strip()]


def run_name(method: str, seed: int) -> str:
    return f"{method}_s{seed}"


def run_config(config, method: str, seed: int):
    from configs.methods_quickstart import apply_method
    return apply_method(copy.deepcopy(config), method, seed)


class Stages(StageLog):
    def __init__(self, config):
        self.config = config
        self.m = _methods(config)
        self.out = self.m.out
        os.makedirs(self.out, exist_ok=True)
        self.datasets = as_list(self.m.datasets)
        self.runs = [(m, int(s)) for m in as_list(self.m.methods) for s in as_list(self.m.seeds)]
        self.archive_dir = str(self.m.get("archive", "") or "")

    def times(self) -> dict:
        """Stage times: the archive's, overridden item by item by `out`'s."""
        merged = _read_json(os.path.join(self.archive_dir, "stages.json")) if self.archive_dir else {}
        for stage, items in self._own_times().items():
            merged.setdefault(stage, {}).update(items)
        return merged

    def train(self) -> dict:
        from dart_jax.analysis.cea_run import trained_steps
        from dart_jax.rl.trainer import Trainer
        from dart_jax.run.run_dir import RESUMABLE, config_dict, config_differences, saved_config
        done = {}
        for method, seed in self.runs:
            name = run_name(method, seed)
            rc = run_config(self.config, method, seed)
            have, want = trained_steps(rc.output.dir), int(rc.train.steps)
            if have < want and self.archived(name, want, self._limit()):
                log.info("methods train %s: archived in %s (trained and evaluated earlier)", name, self.archive_dir)
                done[name] = "archived"
                continue
            saved = saved_config(rc.output.dir)
            diffs = config_differences(saved, config_dict(rc), ignore=RESUMABLE) if saved else []
            if diffs:
                raise ValueError(f"methods train {name}: {rc.output.dir} was written by another configuration ("
                                 + "; ".join(diffs) + "). Move it aside, or give the comparison another methods.out")
            if have >= want:
                log.info("methods train %s: done (%s holds step %d)", name, rc.output.dir, have)
                done[name] = "skipped"
                continue
            t0 = time.perf_counter()
            Trainer(rc).run(resume=have > 0, overwrite=have == 0)
            self._record("train", name, time.perf_counter() - t0, steps=want, resumed_from=have)
            done[name] = "trained"
        return done

    def eval_dir(self, name: str) -> str:
        return os.path.join(self.out, "eval", name)

    def _limit(self) -> int | None:
        return int(self.m.limit) if self.m.limit else None

    def _finished(self, eval_dir: str, step: int | None, limit: int | None) -> bool:
        """results.json (written last) in eval_dir is of the checkpoint at `step`, with this limit, over
        these datasets."""
        path = os.path.join(eval_dir, "results.json")
        if not os.path.isfile(path):
            return False
        setup = (done := _read_json(path))["setup"]
        return setup.get("step") == step and setup.get("limit") == limit and \
            sorted(done["datasets"]) == sorted(self.datasets)

    def evaluated(self, name: str, step: int | None, limit: int | None) -> bool:
        """The run's evaluation is finished for this comparison, in `out`."""
        return self._finished(self.eval_dir(name), step, limit)

    def archived(self, name: str, step: int | None, limit: int | None) -> bool:
        """The run's finished evaluation (and, for a trained run, its metrics) are in the archive."""
        if not self.archive_dir or not self._finished(os.path.join(self.archive_dir, "eval", name), step, limit):
            return False
        return name == REFERENCE or os.path.isfile(os.path.join(self.archive_dir, "train", name, "metrics.jsonl"))

    def archive(self) -> dict:
        """Copy what the report needs of every run finished in `out` into the archive (idempotent)."""
        if not self.archive_dir:
            return {}
        limit, done = self._limit(), {}
        names = [(REFERENCE, None)] + [(run_name(m, s), int(run_config(self.config, m, s).train.steps))
                                       for m, s in self.runs]
        for name, step in names:
            if self.evaluated(name, step, limit):
                done[name] = self._archive_run(name)
        return done

    def _archive_run(self, name: str) -> str:
        if not self.archive_dir:
            return "no archive"
        src, dst = self.eval_dir(name), os.path.join(self.archive_dir, "eval", name)
        os.makedirs(dst, exist_ok=True)
        with open(os.path.join(src, "per_question.jsonl"), "rb") as f, \
                gzip.GzipFile(os.path.join(dst, "per_question.jsonl.gz"), "wb", mtime=0) as g:
            shutil.copyfileobj(f, g)
        if name != REFERENCE:
            m = os.path.join(self.out, "train", name, "metrics.jsonl")
            os.makedirs(os.path.join(self.archive_dir, "train", name), exist_ok=True)
            shutil.copyfile(m, os.path.join(self.archive_dir, "train", name, "metrics.jsonl"))
        shutil.copyfile(os.path.join(src, "results.json"), os.path.join(dst, "results.json"))  # last: the mark
        times = _read_json(os.path.join(self.archive_dir, "stages.json"))
        for stage, items in self._own_times().items():
            for item, t in items.items():
                if item == name:
                    times.setdefault(stage, {})[item] = t
        _write_json(os.path.join(self.archive_dir, "stages.json"), times)
        log.info("methods archive %s: %s", name, dst)
        return "archived"

    def _source(self, name: str, step: int | None, limit: int | None) -> dict | None:
        """{train, eval} directories of a finished run (out first, then the archive), or None."""
        if self.evaluated(name, step, limit):
            return {"train": os.path.join(self.out, "train", name), "eval": self.eval_dir(name)}
        if self.archived(name, step, limit):
            return {"train": os.path.join(self.archive_dir, "train", name),
                    "eval": os.path.join(self.archive_dir, "eval", name)}
        return None

    def evaluate(self) -> dict:
        from dart_jax.analysis.cea_run import trained_steps
        from dart_jax.eval.job import evaluate
        from dart_jax.eval.runner import EvalOptions
        options = EvalOptions(batch=int(self.m.batch), limit=int(self.m.limit) if self.m.limit else None,
                              progress=True)
        done = {}
        if self.m.get("reference", True):
            done[REFERENCE] = self._evaluate_reference(options)
        for method, seed in self.runs:
            name = run_name(method, seed)
            rc = run_config(self.config, method, seed)
            want = int(rc.train.steps)
            if not self.evaluated(name, want, options.limit) and self.archived(name, want, options.limit):
                done[name] = "archived"
                continue
            if trained_steps(rc.output.dir) < want:
                raise FileNotFoundError(f"methods eval {name}: {rc.output.dir} has no finished checkpoint at step "
                                        f"{want} (run the train stage first)")
            if self.evaluated(name, want, options.limit):
                done[name] = "skipped"
                continue
            t0 = time.perf_counter()
            res = evaluate(rc, self.eval_dir(name), self.datasets, options, checkpoint=rc.output.dir,
                           step=want)
            self._record("eval", name, time.perf_counter() - t0,
                         scores={k: r["score"] for k, r in res["datasets"].items()})
            self._archive_run(name)
            done[name] = {k: r["score"] for k, r in res["datasets"].items()}
        return done

    def _evaluate_reference(self, options):
        """The starting policy (the config's model + warm start, no adapters) evaluated like the runs."""
        from dart_jax.eval.job import evaluate
        if self.evaluated(REFERENCE, None, options.limit):
            return "skipped"
        if self.archived(REFERENCE, None, options.limit):
            return "archived"
        t0 = time.perf_counter()
        res = evaluate(copy.deepcopy(self.config), self.eval_dir(REFERENCE), self.datasets, options)
        scores = {k: r["score"] for k, r in res["datasets"].items()}
        self._record("eval", REFERENCE, time.perf_counter() - t0, scores=scores)
        self._archive_run(REFERENCE)
        return scores

    def report(self) -> dict:
        from dart_jax.analysis.methods_report import write_report
        t0 = time.perf_counter()
        limit = self._limit()
        # a run not yet trained and evaluated (or whose evaluation is unfinished) is listed as missing
        runs, missing = {}, []
        for m, s in self.runs:
            src = self._source(run_name(m, s), int(run_config(self.config, m, s).train.steps), limit)
            if src is None:
                missing.append(run_name(m, s))
            else:
                runs[run_name(m, s)] = {"method": m, "seed": s, **src}
        if not runs:
            where = f"{self.out}/eval" + (f" or {self.archive_dir}/eval" if self.archive_dir else "")
            raise FileNotFoundError(f"methods report: no evaluated run under {where} (run train and eval first)")
        ref = self._source(REFERENCE, None, limit)
        reference = ref["eval"] if ref else None
        summary = write_report(runs, os.path.join(self.out, "report"), self.datasets, self.times(),
                               missing=missing, reference=reference)
        self._record("report", "all", time.perf_counter() - t0)
        return summary

    def run(self, stages=STAGES) -> dict | None:
        unknown = [s for s in stages if s not in STAGES]
        if unknown:
            raise ValueError(f"unknown stages {unknown}; expected some of {STAGES}")
        out = None
        if "train" in stages:
            self.train()
        if "eval" in stages:
            self.evaluate()
        if "archive" in stages:
            self.archive()
        if "report" in stages:
            out = self.report()
        return out


def _read_json(path: str) -> dict:
    if not os.path.isfile(path):
        return {}
    with open(path) as f:
        return json.load(f)


def _write_json(path: str, obj) -> None:
    os.makedirs(os.path.dirname(path) or ".", exist_ok=True)
    tmp = path + ".tmp"
    with open(tmp, "w") as f:
        json.dump(obj, f, indent=1)
    os.replace(tmp, path)
