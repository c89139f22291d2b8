"""A run's output directory: what it holds, when a run may write into it, and why a resume failed.

A run directory holds `checkpoints/`, the records (`metrics.jsonl`, `rollouts.jsonl`, `tb/`) and
`run_config.json` (the configuration that wrote them). The rules keep a run's records from being
destroyed by accident:
- a fresh run refuses a directory that already holds checkpoints or records, unless `overwrite`
  (then they are removed first);
- `--resume` restores the newest checkpoint that verifies; when none does, it fails and says why:
  a configuration that differs from the one that wrote the checkpoints (named field by field), or
  corrupt / unfinished files (named checkpoint by checkpoint). Nothing is truncated then;
- only a successful resume drops the records written after the restored step (they describe
  parameters that are no longer on disk).
"""

from __future__ import annotations

import json
import os
import shutil

from dart_jax.run.spec import SECTIONS, SFTSettings, defaults

RUN_CONFIG = "run_config.json"
PROVENANCE = "provenance.jsonl"  # run.provenance: which code and machine wrote each (re)start
RECORDS = ("metrics.jsonl", "rollouts.jsonl")
RECORD_DIRS = ("checkpoints", "tb")
# a resumed run may change how long it runs and what it writes or prints: not reported as differences
RESUMABLE = ("train.steps", "sft.epochs", "output.progress", "output.tensorboard", "output.checkpoint_every",
             "output.keep", "eval.every", "train.release_host_memory")


class RunDirError(RuntimeError):
    pass


def flat(d: dict, prefix: str = "") -> dict:
    """Nested dicts -> {"a.b.c": value}."""
    out = {}
    for k, v in d.items():
        if isinstance(v, dict):
            out.update(flat(v, f"{prefix}{k}."))
        else:
            out[f"{prefix}{k}"] = v
    return out


def config_dict(config) -> dict:
    """A config (ConfigDict or dict) as plain JSON-able nested dicts."""
    return json.loads(config.to_json() if hasattr(config, "to_json") else json.dumps(config))


def setting_defaults() -> dict:
    """{"section.field": default} of every setting (run.spec's dataclasses, the warm start's too)."""
    return flat(config_dict(defaults({**SECTIONS, "sft": SFTSettings})))


def config_differences(saved: dict, current: dict, ignore=RESUMABLE) -> list[str]:
    """'field: old → new' for every leaf that differs, except the fields a resume may change. A field
    the saved config lacks (added to the code after that run was written) is no difference when the
    current value is its default (run.spec's dataclasses): the run was trained with that behaviour."""
    a, b = flat(saved), flat(current)
    known = None
    out = []
    for key in sorted(set(a) | set(b)):
        if key in ignore or a.get(key, "<absent>") == b.get(key, "<absent>"):
            continue
        if key not in a:
            known = setting_defaults() if known is None else known
            if key in known and known[key] == b[key]:
                continue
        out.append(f"{key}: {json.dumps(a.get(key, '<absent>'))} → {json.dumps(b.get(key, '<absent>'))}")
    return out


def holdings(out_dir: str, checkpoint_steps: list[int]) -> list[str]:
    """What in `out_dir` a fresh run would overwrite, in words (empty: nothing)."""
    held = []
    if checkpoint_steps:
        held.append(f"checkpoints at steps {checkpoint_steps}")
    for name in RECORDS:
        path = os.path.join(out_dir, name)
        if os.path.isfile(path) and os.path.getsize(path):
            with open(path) as f:
                held.append(f"{name} ({sum(1 for line in f if line.strip())} records)")
    return held


def start_fresh(out_dir: str, config, checkpoint_steps: list[int], overwrite: bool) -> None:
    """A new run into `out_dir`: refuse if it holds a run, unless `overwrite`; record the config."""
    held = holdings(out_dir, checkpoint_steps)
    if held and not overwrite:
        raise RunDirError(f"output.dir {out_dir} already holds a run ({', '.join(held)}): pass --resume to "
                          "continue it, --overwrite to replace it, or choose another --config.output.dir")
    if held:
        for name in RECORDS + tuple(r + ".torn" for r in RECORDS) + (RUN_CONFIG,):
            if os.path.isfile(os.path.join(out_dir, name)):
                os.remove(os.path.join(out_dir, name))
        for name in RECORD_DIRS:
            shutil.rmtree(os.path.join(out_dir, name), ignore_errors=True)
    if os.path.isfile(os.path.join(out_dir, PROVENANCE)):  # a start that died before writing any record
        os.remove(os.path.join(out_dir, PROVENANCE))
    write_config(out_dir, config)


def write_config(out_dir: str, config) -> None:
    os.makedirs(out_dir, exist_ok=True)
    with open(os.path.join(out_dir, RUN_CONFIG), "w") as f:
        json.dump(config_dict(config), f, indent=1, sort_keys=True)


def saved_config(out_dir: str) -> dict | None:
    """run_config.json of `out_dir` (None when absent); damaged: a one-line RunDirError saying what to do."""
    path = os.path.join(out_dir, RUN_CONFIG)
    if not os.path.isfile(path):
        return None
    with open(path, "rb") as f:
        raw = f.read()
    try:
        saved = json.loads(raw)
    except (ValueError, RecursionError) as e:  # JSONDecodeError, UnicodeDecodeError
        why = " ".join(str(e).split())[:200]
        saved, what = None, f"is not valid JSON ({why})"
    else:
        what = f"holds a {type(saved).__name__}, not a configuration"
    if not isinstance(saved, dict):
        raise RunDirError(f"{path} {what}: the record of the run's configuration is damaged. Restore it from a "
                          f"copy, or move it aside (a resume then compares no configuration), or start again with "
                          "--overwrite")
    return saved


def resume_failure(out_dir: str, config, failures: dict[int, str]) -> RunDirError:
    """Why no checkpoint of `out_dir` could be restored into this run's train state."""
    ckdir = os.path.join(out_dir, "checkpoints")
    if not failures:
        return RunDirError(f"--resume: no checkpoint in {ckdir}: nothing to resume (run without --resume, "
                           "adding --overwrite if the directory holds records of a run that never checkpointed)")
    per_step = "; ".join(f"step {s}: {why}" for s, why in sorted(failures.items(), reverse=True))
    saved = saved_config(out_dir)
    diffs = config_differences(saved, config_dict(config)) if saved is not None else []
    if diffs:
        return RunDirError(f"--resume: the checkpoints in {ckdir} were written by a different configuration "
                           f"({RUN_CONFIG}); this run changes: " + "; ".join(diffs) +
                           ". Resume with the original values, or start a new run in another output.dir. "
                           f"(restore errors: {per_step})")
    what = "with the same configuration" if saved is not None else f"(no {RUN_CONFIG} to compare configurations)"
    if all(why.startswith("CorruptCheckpoint") for why in failures.values()):
        return RunDirError(f"--resume: every checkpoint in {ckdir} is corrupt or unfinished {what}: {per_step}. "
                           "Nothing was changed; --overwrite starts the run again from step 0")
    return RunDirError(f"--resume: no checkpoint in {ckdir} reads into this run's train state {what}: its layout "
                       f"differs (written by another dart_jax version or configuration) or its files are damaged: "
                       f"{per_step}. Nothing was changed; --overwrite starts the run again from step 0")


def resumed_differences(out_dir: str, config) -> list[str]:
    """Fields a successfully resumed run changes relative to the run that wrote the checkpoints."""
    saved = saved_config(out_dir)
    return [] if saved is None else config_differences(saved, config_dict(config))
