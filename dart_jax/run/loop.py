"""The run skeleton both trainers share (GRPO: rl/trainer, SFT: sft/trainer): the files around the steps.

    loop = RunLoop(config, total, "GRPO", resume, overwrite, mesh, allow_change)  # the run_dir rules:
                                                  # fresh; resume: changed settings refused unless allowed
    state, key, meta = loop.restore(state, key)   # resume: the newest usable checkpoint, or fail saying why
    loop.begin()                                  # accepted changes logged, records past the restored step
                                                  # dropped, a provenance line (with them), the metrics writer
    for step in loop.steps():                     # the progress bar
        ...the trainer's step...
        loop.write(step + 1, metrics, **postfix)  # metrics.jsonl + TensorBoard, the bar's postfix
        loop.checkpoint(step + 1, state, key, meta)  # every output.checkpoint_every steps and the last
    out = loop.close(plot_name, plot_keys)        # barrier, the curve plot

A checkpoint holds {"train": the train state, "rng": the key} and meta {..., "step"}. Files are
written by process 0 (its failure reaches every process: parallel.distributed.on_main); the other
processes get a `NullWriter` and no bar.
"""

from __future__ import annotations

import logging
import os
from typing import Any, Iterable, Iterator

import jax

from dart_jax.errors import UserError
from dart_jax.parallel.distributed import barrier, is_main, on_main
from dart_jax.run import provenance, run_dir
from dart_jax.run.checkpoint import Checkpointer, checkpoint_steps
from dart_jax.run.metrics import PLOT_KEYS, MetricsWriter, plot_curves
from dart_jax.run.records import trim_rollouts

log = logging.getLogger(__name__)


class NullWriter:
    """The metrics writer of a process other than 0 (process 0 writes the run's metrics)."""

    def __init__(self, path: str):
        self.path = path

    def write(self, step: int, metrics: dict) -> None:
        pass

    def close(self) -> None:
        pass


def checkpoint_tree(state, key, mesh=None) -> dict:
    """What a checkpoint holds: the train state and the RNG key, replicated on `mesh` when given
    (orbax writes only global arrays in a multi-process run)."""
    if mesh is not None:
        key = jax.device_put(key, jax.sharding.NamedSharding(mesh, jax.sharding.PartitionSpec()))
    return {"train": state, "rng": key}


class RunLoop:
    """One run's directory, checkpoints, records and progress bar over steps [start, total).

    `config`: the run's configuration (its `output` section; recorded in and compared with
    run_config.json). A fresh run refuses an output.dir that holds a run unless `overwrite`; `resume`
    continues from the newest usable checkpoint or fails saying why (`run_dir`), and refuses settings
    that differ from run_config.json unless `allow_change` names them (`run_dir.check_resume`; the
    accepted changes go to provenance.jsonl). `mesh`: the RNG key is saved replicated on it
    (`checkpoint_tree`); None: as it is."""

    def __init__(self, config, total: int, desc: str, resume: bool = False, overwrite: bool = False, mesh=None,
                 allow_change=()):
        self.config, self.total, self.desc, self.resume, self.mesh = config, total, desc, resume, mesh
        oc = config.output
        self.dir, self.every, self.progress, self.tensorboard = oc.dir, oc.checkpoint_every, oc.progress, oc.tensorboard
        allow = run_dir.allow_list(allow_change, config)
        if allow and not resume:
            raise UserError(f"--allow-change={','.join(allow)} accepts changed settings of a resumed run: give it "
                            "with --resume")
        os.makedirs(self.dir, exist_ok=True)
        ckdir = os.path.join(self.dir, "checkpoints")
        self.changes: list[dict] = []
        if not resume:  # files: process 0 writes them (its failure reaches every process), all read them
            on_main(run_dir.start_fresh, self.dir, config, checkpoint_steps(ckdir), overwrite)
        else:  # a damaged run_config.json or a refused change: one line before any checkpoint is moved aside
            self.changes = run_dir.check_resume(self.dir, config, allow)
        self.ckpt = Checkpointer(ckdir, keep=oc.keep)
        self.start = 0
        self.writer: MetricsWriter | NullWriter | None = None
        self.bar = None

    def restore(self, state, key) -> tuple[Any, Any, dict]:
        """Resuming: (train state placed as `state`, key, meta) of the newest checkpoint that verifies
        and loads into their shapes (unusable newer ones moved aside); `start` becomes its step. Fails
        saying why when none does. A fresh run: (state, key, {}) unchanged."""
        if not self.resume:
            return state, key, {}
        got = self.ckpt.restore_latest(checkpoint_tree(state, key, self.mesh), move_unusable=True)
        if got is None:
            self.ckpt.close()
            raise run_dir.resume_failure(self.dir, self.config, self.ckpt.failures)
        self.start, tree, meta = got
        return jax.device_put(tree["train"], jax.tree.map(lambda x: x.sharding, state)), tree["rng"], meta

    def begin(self) -> None:
        """After `restore`: warn of the settings a resume changed, drop the records written past the
        restored step (metrics.jsonl by the writer, rollouts.jsonl; a last line cut short by a crash is set
        aside in `<name>.torn`: `records.rewrite_records`), rewrite run_config.json with the accepted
        changes (the next resume compares with them), append the provenance line, open
        the metrics writer (process 0; the others a NullWriter)."""
        if self.resume:
            self._log_changes()
            if is_main():
                trim_rollouts(self.dir, self.start)
        if is_main():
            if self.resume and self.changes:  # the changed values are the run's settings from here on
                run_dir.write_config(self.dir, self.config)
            provenance.record(self.dir, self.start, self.resume, self.changes)
            self.writer = MetricsWriter(self.dir, resume_step=self.start if self.resume else None,
                                        tensorboard=self.tensorboard)
        else:
            self.writer = NullWriter(os.path.join(self.dir, "metrics.jsonl"))

    def _log_changes(self) -> None:
        """One line per setting this resume changed (run_dir.check_resume accepted it)."""
        for c in self.changes:
            line = run_dir.change_line(c["key"], c["old"], c["new"])
            if c["by"] == "--allow-change":
                log.warning("resumed with a changed setting (--allow-change): %s", line)
            elif c["by"] == "layout":
                log.info("resumed with another layout: %s (same maths; reductions may run in another order)", line)
            else:
                log.info("resumed with %s", line)

    def steps(self) -> Iterator[int]:
        """The steps still to run, through the progress bar (process 0, `output.progress`)."""
        from tqdm.auto import tqdm

        self.bar = tqdm(range(self.start, self.total), initial=self.start, total=self.total, desc=self.desc,
                        unit="step", disable=not self.progress or not is_main())
        return iter(self.bar)

    def write(self, step: int, metrics: dict, **postfix) -> None:
        """Step `step`'s metrics row; `postfix`: what the progress bar shows after it."""
        self.writer.write(step, metrics)
        if postfix and self.bar is not None:
            self.bar.set_postfix(**postfix)

    def checkpoint(self, step: int, state, key, meta: dict | None = None) -> bool:
        """Save after every `output.checkpoint_every`-th step and after the last; True when saved."""
        if step % self.every and step != self.total:
            return False
        self.ckpt.save(step, checkpoint_tree(state, key, self.mesh), {**(meta or {}), "step": step})
        return True

    def close(self, plot_name: str, plot_keys: Iterable[str] = PLOT_KEYS) -> dict:
        """Close the writer and the checkpointer, wait for every process, plot the curves (process 0).
        -> {"metrics": path, "plot": path or None, "checkpoints": directory}."""
        self.writer.close()
        self.ckpt.close()
        barrier("trained")
        plot = plot_curves(self.writer.path, os.path.join(self.dir, plot_name), plot_keys) if is_main() else None
        return {"metrics": self.writer.path, "plot": plot, "checkpoints": self.ckpt.directory}
