"""A staged experiment (launch.cea, launch.grad_angles, launch.methods): its stages run in order by
one dispatcher, and its wall-time record OUT/stages.json = {stage: {item: {seconds, finished, ...}}},
rewritten atomically after each item (by process 0 of a multi-process run)."""

from __future__ import annotations

import json
import os
import time

import jax


class StageLog:
    """Mixin: a class with `self.out` (the experiment's directory) records and reads its stage times,
    and runs its stages: `STAGES` names them in order, each a method of the class (`STAGE_METHODS`
    maps a stage to another method name); `run(stages)` runs the chosen ones in that order and returns
    what the last stage of `STAGES` returns (its summary), None when that stage is not chosen."""

    out: str
    STAGES: tuple[str, ...] = ()
    STAGE_METHODS: dict[str, str] = {}
    STUDY = ""  # the experiment's name in messages

    def run(self, stages=None):
        stages = self.STAGES if stages is None else tuple(stages)
        unknown = [s for s in stages if s not in self.STAGES]
        if unknown:
            raise ValueError(f"unknown {self.STUDY + ' ' if self.STUDY else ''}stages {unknown}; expected some of "
                             f"{self.STAGES}")
        out = None
        for stage in self.STAGES:
            if stage in stages:
                got = getattr(self, self.STAGE_METHODS.get(stage, stage))()
                out = got if stage == self.STAGES[-1] else out
        return out

    @property
    def log_path(self) -> str:
        return os.path.join(self.out, "stages.json")

    def _record(self, stage: str, item: str, seconds: float, **extra) -> None:
        if jax.process_index() != 0:
            return
        times = self._own_times()
        times.setdefault(stage, {})[item] = {"seconds": round(seconds, 1),
                                             "finished": time.strftime("%Y-%m-%d %H:%M:%S"), **extra}
        tmp = self.log_path + ".tmp"
        with open(tmp, "w") as f:
            json.dump(times, f, indent=1)
        os.replace(tmp, self.log_path)

    def times(self) -> dict:
        return self._own_times()

    def _own_times(self) -> dict:
        """What OUT/stages.json holds (times() may add records kept elsewhere)."""
        if not os.path.isfile(self.log_path):
            return {}
        with open(self.log_path) as f:
            return json.load(f)
