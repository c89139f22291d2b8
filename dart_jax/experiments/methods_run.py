"""The method comparison as resumable stages over one output directory (`config.methods.out`):

    train/<method>_s<seed>/   one GRPO run per (method, seed): the config with only the method and the
                              seed changed (`apply_method`); resumed from its
                              newest finished checkpoint, skipped once it reached train.steps; a
                              directory written by another configuration is refused, field by field
    eval/<method>_s<seed>/    greedy held-out evaluation of the run's last checkpoint (eval.job; an
                              interrupted evaluation continues: eval.resume)
    eval/warm_start/          the same evaluation of the policy every run starts from (the warm start,
                              no GRPO): the reference each run's gains and losses are paired against
                              (`methods.reference`)
    report/                   report.md, summary.json, results.csv, reward_curves.png (methods_report;
                              `methods.report` writes them elsewhere, e.g. into the committed findings)
    stages.json               each stage's wall time and when it finished

`methods.archive` (a directory, relative to the repository; "" for none) keeps what the report needs
of every finished run, small enough to commit, so the comparison survives the loss of `out` (a fresh
clone, a new machine): train/<run>/metrics.jsonl and rollouts.jsonl.gz (each step's scored
trajectories, without their text: GRPO's signal, methods_report.signal); eval/<run>/results.json,
per_question.jsonl.gz and config.json (the run's configuration); stages.json (the archived runs'
stage times). A run archived finished (same step, limit and datasets, and the same configuration
apart from `methods`, what a resume may change and output.dir) is neither trained nor evaluated
again, and the report reads it from the archive when `out` lacks it. Evaluations are archived as they
finish, and an evaluation found finished in `out` but not archived is archived when the eval stage
passes it (`--stage=archive`: all of them). A finished entry made differently (a trial with fewer
steps, another configuration) is never overwritten: give trials another archive, or
`--config.methods.archive=`.

The degeneracy gate (experiments.gate, `gate`) on each evaluation's trajectories (per_question.jsonl, in `out`
or the archive): the report writes its verdict into summary.json and report.md. Under `gate="strict"` the
train stage evaluates the warm start (the reference) first and refuses before any training when its
trajectories fill a template, and the eval stage refuses at the first flagged run.
"""

from __future__ import annotations

import copy
import gzip
import json
import logging
import os
import shutil
import time

import jax

from dart_jax.experiments import gate as dgate
from dart_jax.experiments.stage_log import StageLog
from dart_jax.run.run_dir import PROVENANCE, RESUMABLE

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


# the compared methods (configs/methods_quickstart.py describes them): method settings, learning rate and
# the execution settings a run overrides
METHODS = {
    "dart": dict(variant="dart", rank=8, alpha=16.0, lr=2e-4),
    "lora16": dict(variant="lora", rank=16, alpha=32.0, lr=2e-4),
    "full": dict(variant="full", lr=2e-5, invalid_action="search_r1"),
    "mixlora": dict(variant="mixlora", rank=8, alpha=16.0, experts=2, top_k=2, router_aux_coef=0.001, lr=2e-4),
    # two full models: the backward pass recomputes all but the weight matmuls (remat "dots_no_batch"; the
    # other runs keep everything, "none"): same math, update peak RSS 11.9 GB on 16 × 896 tokens (2-Agent-
    # LoRA under "none" peaked at 21.6 GB); a checkpoint every 4 steps (~3 min a step alone on 2 cores)
    "2agent": dict(variant="2agent", lr=2e-5, remat_policy="dots_no_batch", checkpoint_every=4),
    "2agent_lora": dict(variant="2agent", agent_params="lora", rank=8, alpha=16.0, lr=2e-4),
}


def apply_method(c, method: str, seed: int):
    """The comparison's config `c` (configs/methods_quickstart.py) turned into one run of it: only the
    method and the seed changed (in place; returns it)."""
    if method not in METHODS:
        raise ValueError(f"method {method!r}; expected one of {sorted(METHODS)}")
    m = dict(METHODS[method])
    # a study may scale every method's learning rate alike (methods.lr_scale: the lab's 8 steps, where the
    # NQ comparison's rates move nothing); the ratios between methods stay the comparison's
    c.optim.lr = m.pop("lr") * float(c.methods.get("lr_scale", 1.0))
    if "invalid_action" in m:
        c.rollout.invalid_action = m.pop("invalid_action")
    # execution settings (what is kept for the backward pass, how often to checkpoint): no change to the math
    if "remat_policy" in m:
        c.model.remat_policy = m.pop("remat_policy")
    if "checkpoint_every" in m:
        c.output.checkpoint_every = m.pop("checkpoint_every")
    for k, v in m.items():
        c.method[k] = v
    if c.method.variant == "2agent" and c.rollout.get("engine") == "continuous":
        # two models decode batch-synchronously (serve.rollouts.check_engine): its evaluation runs the batch
        # loop, the same draws per row as the engine's (greedy: the same tokens up to batch-shape rounding)
        c.rollout.engine = "batch"
    c.train.seed = int(seed)
    c.output.dir = f"{c.methods.out}/train/{method}_s{seed}"
    c.output.export_adapters = method == "dart"
    return c


def relocate(c, out: str, archive: str):
    """A run config of one study (`apply_method`'s) moved to another study's `out` and `archive`, for a
    study defined as another's with a setting changed (in place; returns it)."""
    run = os.path.basename(c.output.dir)
    c.methods.out, c.methods.archive = out, archive
    c.output.dir = f"{out}/train/{run}"
    return c


def run_config(config, method: str, seed: int):
    return apply_method(copy.deepcopy(config), method, seed)


# what may differ between an archived run's configuration and the comparison's (besides the `methods`
# section, which names the comparison and never changes a run)
ARCHIVE_IGNORE = RESUMABLE + ("output.dir",)
# sections that do not change the starting policy's evaluation (the reference run)
REFERENCE_IRRELEVANT = ("methods", "method", "optim", "train", "loss", "output", "eval", "data")
REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


class MethodsStages(StageLog):
    STAGES = STAGES
    STAGE_METHODS = {"eval": "evaluate"}
    def __init__(self, config, gate: str = "warn"):
        self.config = config
        self.gate = dgate.check_mode(gate)
        self.m = _methods(config)
        self.out = self.m.out
        os.makedirs(self.out, exist_ok=True)
        self.datasets = as_list(self.m.datasets)
        self.runs = [(m, int(s)) for m in as_list(self.m.methods) for s in as_list(self.m.seeds)]
        archive = str(self.m.get("archive", "") or "")
        # a relative archive is the repository's (committed with the findings), wherever the command runs
        self.archive_dir = os.path.join(REPO, archive) if archive and not os.path.isabs(archive) else archive

    def times(self) -> dict:
        """Stage times: the archive's, overridden item by item by `out`'s; a training's from its logged steps
        where its metrics are found (`logged_seconds`: every segment of a resumed run)."""
        merged = _read_json(os.path.join(self.archive_dir, "stages.json")) if self.archive_dir else {}
        for stage, items in self._own_times().items():
            merged.setdefault(stage, {}).update(items)
        for name, item in merged.get("train", {}).items():
            for root in (self.out, self.archive_dir):
                logged = logged_seconds(os.path.join(root, "train", name)) if root else None
                if logged is not None:
                    item.update(seconds=round(logged, 1), logged=True)
                    break
        return merged

    def train(self) -> dict:
        from dart_jax.experiments.cea_run import trained_steps
        from dart_jax.rl.trainer import Trainer
        from dart_jax.run.run_dir import config_dict, config_differences, saved_config
        if self.gate == "strict":  # the warm start's trajectories gated before any training
            if self.m.get("reference", True):
                self._evaluate_reference(self._eval_options())
                self.check_gate([REFERENCE])
            else:
                log.warning("methods gate: methods.reference is off, so the warm start is not evaluated: the strict "
                            "gate is checked on each run's evaluation, after its training")
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
            diffs = config_differences(_without(saved, "methods"), _without(config_dict(rc), "methods"),
                                       ignore=RESUMABLE) if saved else []
            if diffs:
                raise ValueError(f"methods train {name}: {rc.output.dir} was written by another configuration ("
                                 + "; ".join(diffs) + "). Move it aside, or give the comparison another methods.out")
            if have >= want:
                log.info("methods train %s: done (%s holds step %d)", name, rc.output.dir, have)
                done[name] = "skipped"
                continue
            # a resumed run's time: its kept steps' logged times over every segment (logged_seconds)
            t0 = time.perf_counter()
            Trainer(rc).run(resume=have > 0, overwrite=have == 0)
            logged = logged_seconds(rc.output.dir)
            self._record("train", name, time.perf_counter() - t0 if logged is None else logged, steps=want,
                         resumed_from=have, logged=logged is not None)
            done[name] = "trained"
        return done

    def eval_dir(self, name: str) -> str:
        return os.path.join(self.out, "eval", name)

    def _limit(self) -> int | None:
        return int(self.m.limit) if self.m.limit else None

    def _finished(self, eval_dir: str, step: int | None, limit: int | None) -> bool:
        """results.json (written last) in eval_dir is of the checkpoint at `step`, with this limit, over
        these datasets."""
        try:
            done = _read_json(os.path.join(eval_dir, "results.json"))
        except ValueError:  # cut short while written: not a finished evaluation
            return False
        if not done:
            return False
        setup = done["setup"]
        return setup.get("step") == step and setup.get("limit") == limit and \
            sorted(done["datasets"]) == sorted(self.datasets)

    def evaluated(self, name: str, step: int | None, limit: int | None) -> bool:
        """The run's evaluation is finished for this comparison, in `out`."""
        return self._finished(self.eval_dir(name), step, limit)

    def _run_settings(self, name: str) -> dict:
        """The configuration an archived run must have been made with to stand for `name` here."""
        from dart_jax.run.run_dir import config_dict
        if name == REFERENCE:
            return {k: v for k, v in config_dict(self.config).items() if k not in REFERENCE_IRRELEVANT}
        method, seed = next((m, s) for m, s in self.runs if run_name(m, s) == name)
        return _without(config_dict(run_config(self.config, method, seed)), "methods")

    def _archive_differences(self, name: str) -> list[str]:
        from dart_jax.run.run_dir import config_differences
        saved = _read_json(os.path.join(self.archive_dir, "eval", name, "config.json"))
        if not saved:
            return ["no config.json"]
        return config_differences(saved, self._run_settings(name), ignore=ARCHIVE_IGNORE)

    def archived(self, name: str, step: int | None, limit: int | None) -> bool:
        """The archive holds this run finished: its evaluation (step, limit, datasets), its training metrics,
        made with this comparison's configuration of the run (else it is not used, with a warning)."""
        if not self.archive_dir or not self._finished(os.path.join(self.archive_dir, "eval", name), step, limit):
            return False
        if name != REFERENCE and not os.path.isfile(os.path.join(self.archive_dir, "train", name, "metrics.jsonl")):
            return False
        diffs = self._archive_differences(name)
        if diffs:
            log.warning("methods archive %s: made with another configuration (%s): not used", name, "; ".join(diffs))
            return False
        return True

    def archive(self) -> dict:
        """Copy what the report needs of this comparison's runs (and the reference) finished in `out` into
        the archive (idempotent)."""
        if not self.archive_dir:
            log.warning("methods archive: methods.archive is empty: nothing archived")
            return {}
        limit, done = self._limit(), {}
        names = [(REFERENCE, None)] + [(run_name(m, s), int(run_config(self.config, m, s).train.steps))
                                       for m, s in self.runs]
        for name, step in names:
            if self.evaluated(name, step, limit):
                done[name] = self._archive_run(name, step, limit)
        return done

    def _archive_run(self, name: str, step: int | None, limit: int | None) -> str:
        """Archive one run finished in `out`: never over a finished entry made differently (a trial run
        with fewer steps or questions, another configuration); the eval directory is swapped in whole,
        after the metrics, so an entry is complete or absent."""
        if not self.archive_dir or jax.process_index() != 0:
            return "not archived"
        src, dst = self.eval_dir(name), os.path.join(self.archive_dir, "eval", name)
        if os.path.isfile(os.path.join(dst, "results.json")):
            diffs = [] if self._finished(dst, step, limit) else ["its step, limit or datasets"]
            diffs += self._archive_differences(name) if not diffs else []
            if not diffs and _same_results(src, dst):
                # archived before: its config.json (the settings it ran with) is kept, not rewritten with
                # settings added since
                return "archived earlier"
            if diffs:
                log.warning("methods archive %s: %s holds a finished run made differently (%s); left as it is "
                            "(give a trial comparison another methods.archive, or '' for none)", name, dst,
                            "; ".join(diffs))
                return "kept the archive's"
        if name != REFERENCE:
            train = os.path.join(self.archive_dir, "train", name)
            os.makedirs(train, exist_ok=True)
            shutil.copyfile(os.path.join(self.out, "train", name, "metrics.jsonl"), os.path.join(train, "metrics.tmp"))
            os.replace(os.path.join(train, "metrics.tmp"), os.path.join(train, "metrics.jsonl"))
            _archive_scores(os.path.join(self.out, "train", name, "rollouts.jsonl"),
                            os.path.join(train, "rollouts.jsonl.gz"))
            prov = os.path.join(self.out, "train", name, PROVENANCE)
            if os.path.isfile(prov):  # runs trained before run.provenance existed have none
                shutil.copyfile(prov, os.path.join(train, "provenance.tmp"))
                os.replace(os.path.join(train, "provenance.tmp"), os.path.join(train, PROVENANCE))
        tmp = dst + ".tmp"
        shutil.rmtree(tmp, ignore_errors=True)
        os.makedirs(tmp)
        with open(os.path.join(src, "per_question.jsonl"), "rb") as f, \
                gzip.GzipFile(os.path.join(tmp, "per_question.jsonl.gz"), "wb", mtime=0) as g:
            shutil.copyfileobj(f, g)
        _write_json(os.path.join(tmp, "config.json"), self._run_settings(name))
        shutil.copyfile(os.path.join(src, "results.json"), os.path.join(tmp, "results.json"))
        if os.path.isdir(dst):
            shutil.rmtree(dst + ".old", ignore_errors=True)
            os.replace(dst, dst + ".old")
        os.replace(tmp, dst)
        shutil.rmtree(dst + ".old", ignore_errors=True)
        path = os.path.join(self.archive_dir, "stages.json")
        times = {stage: {k: v for k, v in items.items() if k != name} for stage, items in _read_json(path).items()}
        for stage, items in self._own_times().items():
            if name in items:
                times.setdefault(stage, {})[name] = items[name]
        _write_json(path, {stage: items for stage, items in times.items() if items})
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

    def _archive_if_missing(self, name: str, step: int | None, limit: int | None) -> None:
        """An evaluation finished in `out` before (another process, older code) goes to the archive too."""
        if self.archive_dir and not self.archived(name, step, limit):
            self._archive_run(name, step, limit)

    def evaluate(self) -> dict:
        from dart_jax.eval.job import evaluate
        from dart_jax.experiments.cea_run import trained_steps
        options = self._eval_options()
        done = {}
        if self.m.get("reference", True):
            done[REFERENCE] = self._evaluate_reference(options)
            if self.gate == "strict":
                self.check_gate([REFERENCE])
        for method, seed in self.runs:
            name = run_name(method, seed)
            rc = run_config(self.config, method, seed)
            want = int(rc.train.steps)
            if self.evaluated(name, want, options.limit):
                self._archive_if_missing(name, want, options.limit)
                done[name] = "skipped"
                continue
            if self.archived(name, want, options.limit):
                done[name] = "archived"
                continue
            if trained_steps(rc.output.dir) < want:
                raise FileNotFoundError(f"methods eval {name}: {rc.output.dir} has no finished checkpoint at step "
                                        f"{want} (run the train stage first)")
            t0 = time.perf_counter()
            res = evaluate(rc, self.eval_dir(name), self.datasets, options, checkpoint=rc.output.dir,
                           step=want)
            self._record("eval", name, time.perf_counter() - t0,
                         scores={k: r["score"] for k, r in res["datasets"].items()})
            self._archive_run(name, want, options.limit)
            done[name] = {k: r["score"] for k, r in res["datasets"].items()}
            if self.gate == "strict":
                self.check_gate([name])
        if self.gate == "warn":
            self.check_gate(list(done))
        return done

    def _eval_options(self):
        from dart_jax.eval.runner import EvalOptions
        return EvalOptions(batch=int(self.m.batch), limit=self._limit(), progress=True)

    def _step(self, name: str) -> int | None:
        if name == REFERENCE:
            return None
        method, seed = next((m, s) for m, s in self.runs if run_name(m, s) == name)
        return int(run_config(self.config, method, seed).train.steps)

    def check_gate(self, names: list[str]) -> dict | None:
        """The gate over the finished evaluations among `names` (in `out` or the archive; None: gate off)."""
        if self.gate == "off":
            return None
        sets = {}
        for name in names:
            src = self._source(name, self._step(name), self._limit())
            if src is not None:
                sets[name] = dgate.eval_records(src["eval"])
        return dgate.enforce(dgate.study_gate(sets), self.gate, "methods")

    def _evaluate_reference(self, options):
        """The starting policy (the config's model + warm start, no adapters) evaluated like the runs."""
        from dart_jax.eval.job import evaluate
        if self.evaluated(REFERENCE, None, options.limit):
            self._archive_if_missing(REFERENCE, None, options.limit)
            return "skipped"
        if self.archived(REFERENCE, None, options.limit):
            return "archived"
        t0 = time.perf_counter()
        res = evaluate(copy.deepcopy(self.config), self.eval_dir(REFERENCE), self.datasets, options)
        scores = {k: r["score"] for k, r in res["datasets"].items()}
        self._record("eval", REFERENCE, time.perf_counter() - t0, scores=scores)
        self._archive_run(REFERENCE, None, options.limit)
        return scores

    def report(self) -> dict:
        from dart_jax.experiments.methods_report import write_report
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
        shown = set(runs) | ({REFERENCE} if reference else set())  # the times of what the report covers
        times = {stage: {k: v for k, v in items.items() if k in shown or stage == "report"}
                 for stage, items in self.times().items()}
        report_dir = self.config.methods.report or os.path.join(self.out, "report")
        gate = self.check_gate(([REFERENCE] if reference else []) + list(runs))
        summary = write_report(runs, report_dir, self.datasets, times,
                               missing=missing, reference=reference)
        if gate is not None:
            dgate.add_to_report(report_dir, gate)
            summary[dgate.KEY] = gate
        self._record("report", "all", time.perf_counter() - t0)
        return summary



def _archive_scores(src: str, dst: str) -> None:
    """A run's rollout records with the trajectory's and the question's text left out ("pieces",
    "question"; the rest as the trainer wrote it: step, uid, score, accuracy, finish, in_update, gold
    answers, a SQL row's database and gold query), gzipped; a cut-short last record is left out. Runs
    archived before this existed have none: `--stage=archive` adds it while `out` still holds them."""
    from dart_jax.run.records import read_records
    if not os.path.isfile(src):
        return
    with open(dst + ".tmp", "wb") as raw, gzip.GzipFile(filename="", fileobj=raw, mode="wb", mtime=0) as g:
        for rec in read_records(src):
            g.write((json.dumps({k: v for k, v in rec.items() if k not in ("pieces", "question")}) + "\n").encode())
    os.replace(dst + ".tmp", dst)


def _same_results(src: str, dst: str) -> bool:
    """The evaluation in `src` is the one archived in `dst` (the same results.json)."""
    a, b = _read_json(os.path.join(src, "results.json")), _read_json(os.path.join(dst, "results.json"))
    return bool(a) and a == b


def logged_seconds(run_dir: str) -> float | None:
    """A training run's time as its metrics logged it: each kept GRPO step's `time/step_s` and each held-out
    check's `time/eval_s`, summed over metrics.jsonl (a resumed run's segments all count; a resume drops
    the rows after its checkpoint, so steps a kill cut short, start-up and checkpoint saves do not). None
    without the file. A step's time includes any pause of its process."""
    from dart_jax.run.metrics import read_metrics  # a last line cut short by a kill: skipped, logged
    path = os.path.join(run_dir, "metrics.jsonl")
    if not os.path.isfile(path):
        return None
    return float(sum(r.get("time/step_s", 0.0) + r.get("time/eval_s", 0.0) for r in read_metrics(path)))


def _read_json(path: str) -> dict:
    if not os.path.isfile(path):
        return {}
    with open(path) as f:
        return json.load(f)


def _write_json(path: str, obj) -> None:
    import tempfile
    os.makedirs(os.path.dirname(path) or ".", exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=os.path.dirname(path) or ".", suffix=".tmp")
    with os.fdopen(fd, "w") as f:
        json.dump(obj, f, indent=1)
    os.replace(tmp, path)


def _without(d: dict | None, key: str) -> dict | None:
    return None if d is None else {k: v for k, v in d.items() if k != key}
