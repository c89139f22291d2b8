"""The wall-time record of a staged experiment (launch.cea, launch.grad_angles, launch.methods):
OUT/stages.json = {stage: {item: {seconds, finished, ...}}}, rewritten atomically after each item (by
process 0 of a multi-process run)."""

from __future__ import annotations

import json
import os
import time

import jax


class StageLog:
    """Mixin: a class with `self.out` (the experiment's directory) records and reads its stage times."""

    out: str

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
