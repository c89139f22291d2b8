"""Orbax train-state checkpoints: trainable params, optimiser state, step, RNG and data position.

The frozen base is never written (it is reloaded from its own file). Each save is followed by a
SHA-256 manifest of every file of the step (`<dir>/integrity/<step>.json`), written only for a save this
process made (orbax skips a step that already exists: that is an error here, never a new manifest
over someone else's files). Restoring verifies the manifest; a checkpoint whose files are missing,
truncated, altered or not listed in it (an empty or partial manifest verifies nothing) — or that orbax
cannot read — is reported in one line and skipped for the previous one, and
once an older one restores, the unusable newer ones are moved aside to `<dir>/unusable/` (kept for
inspection, never loaded again, never overwritten by a later save of the same step).
keep-last-k through orbax's `max_to_keep`.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import shutil
import time
from typing import Any

import jax
import orbax.checkpoint as ocp

log = logging.getLogger(__name__)


def _key(path) -> str:
    parts = []
    for p in path:
        for attr in ("key", "name", "idx"):
            if hasattr(p, attr):
                parts.append(str(getattr(p, attr)))
                break
        else:
            parts.append(str(p))
    return ".".join(parts)


def flatten_state(tree: Any) -> dict[str, Any]:
    """Pytree -> {dotted path: leaf} (orbax then stores plain dicts, independent of pytree classes)."""
    flat, _ = jax.tree_util.tree_flatten_with_path(tree)
    return {_key(path): leaf for path, leaf in flat}


def unflatten_state(flat: dict[str, Any], like: Any) -> Any:
    paths, treedef = jax.tree_util.tree_flatten_with_path(like)
    keys = [_key(p) for p, _ in paths]
    missing = [k for k in keys if k not in flat]
    extra = sorted(set(flat) - set(keys))
    if missing or extra:
        raise ValueError(f"checkpoint does not match the train state: missing {missing[:5]}, unexpected {extra[:5]}")
    return jax.tree_util.tree_unflatten(treedef, [flat[k] for k in keys])


def _barrier(name: str) -> None:
    if jax.process_count() > 1:
        from jax.experimental import multihost_utils
        multihost_utils.sync_global_devices(name)


def _digest(step_dir: str) -> dict[str, str]:
    out = {}
    for root, _, files in os.walk(step_dir):
        for name in sorted(files):
            path = os.path.join(root, name)
            h = hashlib.sha256()
            with open(path, "rb") as f:
                for block in iter(lambda: f.read(1 << 20), b""):
                    h.update(block)
            out[os.path.relpath(path, step_dir)] = h.hexdigest()
    return out


class CorruptCheckpoint(RuntimeError):
    pass


def checkpoint_steps(directory: str) -> list[int]:
    """Steps with a checkpoint folder in `directory` (without opening it with orbax)."""
    if not os.path.isdir(directory):
        return []
    return sorted(int(n) for n in os.listdir(directory) if n.isdigit() and os.path.isdir(os.path.join(directory, n)))


class Checkpointer:
    def __init__(self, directory: str, keep: int = 3):
        self.failures: dict[int, str] = {}  # step -> why `restore_latest` could not use it
        self.directory = os.path.abspath(directory)
        os.makedirs(os.path.join(self.directory, "integrity"), exist_ok=True)
        self.manager = ocp.CheckpointManager(
            self.directory, options=ocp.CheckpointManagerOptions(max_to_keep=keep, create=True))

    def steps(self) -> list[int]:
        return sorted(self.manager.all_steps())

    def save(self, step: int, state: Any, meta: dict) -> None:
        arrays = flatten_state(state)
        saved = self.manager.save(step, args=ocp.args.Composite(state=ocp.args.StandardSave(arrays),
                                                                meta=ocp.args.JsonSave(meta)))
        self.manager.wait_until_finished()
        from dart_jax.parallel.distributed import allgather_objects
        written = all(allgather_objects(bool(saved) and os.path.isdir(os.path.join(self.directory, str(step)))))
        if not written:  # decided together: no process waits at the barrier below for one that raised
            raise RuntimeError(f"checkpoint {step} was not written to {self.directory}: a checkpoint of that step "
                               "already exists (move it aside or resume from it); no manifest is written for "
                               "files this process did not write")
        if jax.process_index() == 0:  # multi-host: every process saved its shards; one writes the manifest
            with open(os.path.join(self.directory, "integrity", f"{step}.json"), "w") as f:
                json.dump(_digest(os.path.join(self.directory, str(step))), f)
            kept = {str(s) for s in self.steps()}
            for name in os.listdir(os.path.join(self.directory, "integrity")):
                if name.removesuffix(".json") not in kept:
                    os.remove(os.path.join(self.directory, "integrity", name))
        _barrier(f"checkpoint_{step}")

    def verify(self, step: int) -> None:
        manifest = os.path.join(self.directory, "integrity", f"{step}.json")
        if not os.path.isfile(manifest):
            raise CorruptCheckpoint(f"checkpoint {step}: no integrity manifest ({manifest}); the save did not finish")
        try:
            with open(manifest, "rb") as f:
                want = json.load(f)
        except (ValueError, RecursionError) as e:
            raise CorruptCheckpoint(f"checkpoint {step}: its integrity manifest {manifest} is not valid JSON "
                                    f"({' '.join(str(e).split())[:120]})") from None
        if not isinstance(want, dict) or not want or not all(isinstance(v, str) for v in want.values()):
            raise CorruptCheckpoint(f"checkpoint {step}: its integrity manifest {manifest} lists no files "
                                    "(every file of a step must be listed with its SHA-256)")
        have = _digest(os.path.join(self.directory, str(step)))
        missing = sorted(k for k in want if k not in have)
        altered = sorted(k for k in want if k in have and have[k] != want[k])
        unlisted = sorted(k for k in have if k not in want)
        if missing or altered or unlisted:
            why = "; ".join(f"{what}: {names[:5]}" + (f" and {len(names) - 5} more" if len(names) > 5 else "")
                            for what, names in (("files missing or altered", missing + altered),
                                                ("files not in its integrity manifest", unlisted)) if names)
            raise CorruptCheckpoint(f"checkpoint {step}: {why}")

    def restore(self, step: int, like: Any, partial: bool = False) -> tuple[Any, dict]:
        """(`like`'s tree with the checkpoint's arrays, placed as `like`'s leaves; meta). `partial`: `like`
        is a part of the saved tree (e.g. {"train": {"params": …}}) and only that part is read."""
        self.verify(step)
        abstract = {k: ocp.utils.to_shape_dtype_struct(v) if hasattr(v, "shape") else v
                    for k, v in flatten_state(like).items()}
        if partial:
            state = ocp.args.PyTreeRestore(item=abstract, partial_restore=True,
                                           restore_args=ocp.checkpoint_utils.construct_restore_args(abstract))
        else:
            state = ocp.args.StandardRestore(abstract)
        out = self.manager.restore(step, args=ocp.args.Composite(state=state, meta=ocp.args.JsonRestore()))
        return unflatten_state(dict(out["state"]), like), dict(out["meta"])

    def restore_latest(self, like: Any, move_unusable: bool = False,
                       partial: bool = False) -> tuple[int, Any, dict] | None:
        """Newest checkpoint that verifies and loads (`restore`); unusable ones are logged, skipped and
        their reasons kept in `failures` (None when none is usable). With `move_unusable` (a run resuming),
        the unusable checkpoints newer than the one restored are moved aside (`quarantine`); when none
        restores nothing is moved (a changed configuration fails every step of a healthy run)."""
        from dart_jax.parallel.distributed import allgather_objects
        self.failures = {}
        for step in reversed(self.steps()):
            why = None
            try:
                state, meta = self.restore(step, like, partial)
            except Exception as e:  # orbax raises many types for unreadable files
                why = f"{type(e).__name__}: {' '.join(str(e).split())[:300]}"  # one line, never a traceback
            # multi-host: a step is usable only if every process restored it (one process's unreadable
            # shard fails the step everywhere, so all resume from the same step)
            whys = [w for w in allgather_objects(why) if w is not None]
            if whys:
                self.failures[step] = whys[0]
                log.warning("checkpoint %d in %s is unusable (%s); trying the previous one", step, self.directory,
                            whys[0])
                continue
            if move_unusable:
                if jax.process_index() == 0:  # one process moves the files; the others see them moved
                    for bad, why in self.failures.items():
                        self.quarantine(bad, why)
                _barrier("quarantine")
                self.manager.reload()
            return step, state, meta
        return None

    def quarantine(self, step: int, reason: str) -> str:
        """Move checkpoint `step` (and its manifest) to <dir>/unusable/<step>-<time>/ with the reason."""
        dest = os.path.join(self.directory, "unusable", f"{step}-{time.strftime('%Y%m%dT%H%M%S')}")
        os.makedirs(dest, exist_ok=True)
        shutil.move(os.path.join(self.directory, str(step)), os.path.join(dest, str(step)))
        manifest = os.path.join(self.directory, "integrity", f"{step}.json")
        if os.path.isfile(manifest):
            shutil.move(manifest, os.path.join(dest, "integrity.json"))
        with open(os.path.join(dest, "reason.txt"), "w") as f:
            f.write(reason + "\n")
        self.manager.reload()
        log.warning("checkpoint %d moved aside to %s: %s", step, dest, reason)
        return dest

    def close(self) -> None:
        self.manager.close()

