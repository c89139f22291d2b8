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
"""

from __future__ import annotations

import copy
import json
import logging
import os
import time

from dart_jax.analysis.stage_log import StageLog

log = logging.getLogger(__name__)

STAGES = ("train", "eval", "report")
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

    def train(self) -> dict:
        from dart_jax.analysis.cea_run import trained_steps
        from dart_jax.rl.trainer import Trainer
        from dart_jax.run.run_dir import RESUMABLE, config_dict, config_differences, saved_config
        done = {}
        for method, seed in self.runs:
            name = run_name(method, seed)
            rc = run_config(self.config, method, seed)
            have, want = trained_steps(rc.output.dir), int(rc.train.steps)
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

    def evaluated(self, name: str, step: int, limit: int | None) -> bool:
        """The run's evaluation is finished for this comparison: results.json (written last) of the
        checkpoint at `step`, with this limit, over these datasets."""
        path = os.path.join(self.eval_dir(name), "results.json")
        if not os.path.isfile(path):
            return False
        with open(path) as f:
            done = json.load(f)
        setup = done["setup"]
        return setup.get("step") == step and setup.get("limit") == limit and \
            sorted(done["datasets"]) == sorted(self.datasets)

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
            done[name] = {k: r["score"] for k, r in res["datasets"].items()}
        return done

    def _evaluate_reference(self, options):
        """The starting policy (the config's model + warm start, no adapters) evaluated like the runs."""
        from dart_jax.eval.job import evaluate
        if self.evaluated(REFERENCE, None, options.limit):
            return "skipped"
        t0 = time.perf_counter()
        res = evaluate(copy.deepcopy(self.config), self.eval_dir(REFERENCE), self.datasets, options)
        scores = {k: r["score"] for k, r in res["datasets"].items()}
        self._record("eval", REFERENCE, time.perf_counter() - t0, scores=scores)
        return scores

    def report(self) -> dict:
        from dart_jax.analysis.methods_report import write_report
        t0 = time.perf_counter()
        runs = {run_name(m, s): {"method": m, "seed": s,
                                 "train": run_config(self.config, m, s).output.dir,
                                 "eval": self.eval_dir(run_name(m, s))} for m, s in self.runs}
        # a run not yet trained and evaluated (or whose evaluation is unfinished) is listed as missing
        limit = int(self.m.limit) if self.m.limit else None
        ready = {n: r for n, r in runs.items()
                 if self.evaluated(n, int(run_config(self.config, r["method"], r["seed"]).train.steps), limit)}
        if not ready:
            raise FileNotFoundError(f"methods report: no evaluated run under {self.out}/eval (run train and eval first)")
        reference = self.eval_dir(REFERENCE) if self.evaluated(REFERENCE, None, limit) else None
        summary = write_report(ready, os.path.join(self.out, "report"), self.datasets, self.times(),
                               missing=[n for n in runs if n not in ready], reference=reference)
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
        if "report" in stages:
            out = self.report()
        return out
