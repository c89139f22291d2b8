"""Which code and machine wrote a run: one line in `provenance.jsonl` each time a run starts or resumes.

A run's records say what it computed; this says with what: the dart_jax commit (and whether the
tracked files differed from it), the versions of the libraries that decide the numbers, the
platform and devices, the command line, and the step the (re)start began at. A resumed run appends
a line, so a run trained across code changes says which steps each commit wrote. Nothing here
changes a computed value; when git or a package is unavailable the field is null, never an error.
"""

from __future__ import annotations

import datetime
import importlib.metadata
import logging
import os
import platform
import subprocess
import sys

from dart_jax.run.records import append_record, read_records
from dart_jax.run.run_dir import PROVENANCE as FILE

log = logging.getLogger(__name__)

PACKAGES = ("jax", "jaxlib", "flax", "optax", "orbax-checkpoint", "numpy", "transformers", "tokenizers")
_REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def _git(*args: str) -> str | None:
    try:
        # --no-optional-locks: `git status` must not take .git/index.lock (a commit made as a run starts)
        out = subprocess.run(["git", "--no-optional-locks", "-C", _REPO, *args], capture_output=True, text=True,
                             timeout=10)
    except (OSError, subprocess.SubprocessError):
        return None
    return out.stdout.strip() if out.returncode == 0 else None


def code() -> dict:
    """The checkout dart_jax runs from: commit and whether tracked files differ from it (null off git)."""
    if not os.path.exists(os.path.join(_REPO, ".git")):  # installed, not a checkout: no enclosing repo's commit
        return {"commit": None, "dirty": None}
    commit = _git("rev-parse", "HEAD")
    if commit is None:
        return {"commit": None, "dirty": None}
    status = _git("status", "--porcelain", "--untracked-files=no")
    return {"commit": commit, "dirty": None if status is None else bool(status)}


def versions() -> dict:
    out = {"python": platform.python_version()}
    for p in PACKAGES:
        try:
            out[p] = importlib.metadata.version(p)
        except importlib.metadata.PackageNotFoundError:
            out[p] = None
    return out


def machine() -> dict:
    out = {"platform": platform.platform(), "cpus": os.cpu_count()}
    try:
        import jax
        devs = jax.devices()
        out.update(backend=jax.default_backend(), device_kind=devs[0].device_kind, devices=len(devs),
                   processes=jax.process_count())
    except Exception as e:  # a record of the run, never a reason to stop it
        out["devices_error"] = f"{type(e).__name__}: {e}"
    return out


def record(out_dir: str, start_step: int, resumed: bool, changes: list[dict] | None = None) -> dict:
    """Append this start's line to `out_dir/provenance.jsonl` and return it; `changes`: the settings a
    resume changed ({"key", "old", "new", "by"}: run_dir.check_resume). A last line cut short by a crash
    is set aside first (`records.mend_tail`). A record of the run, never a reason to stop it: a write
    that fails is logged."""
    line = {"time": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
            "start_step": int(start_step), "resumed": bool(resumed), "argv": list(sys.argv),
            **code(), "versions": versions(), "machine": machine()}
    if changes:
        line["changes"] = list(changes)
    try:
        os.makedirs(out_dir, exist_ok=True)
        append_record(os.path.join(out_dir, FILE), line)
    except OSError as e:
        log.warning("provenance not recorded in %s: %s", out_dir, e)
    return line


def read(out_dir: str) -> list[dict]:
    """The lines of `out_dir/provenance.jsonl` (a last line cut short by a crash skipped, logged)."""
    path = os.path.join(out_dir, FILE)
    if not os.path.isfile(path):
        return []
    return read_records(path)
