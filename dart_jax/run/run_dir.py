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
  parameters that are no longer on disk);
- a resume runs the configuration that wrote the run: a setting that differs from run_config.json
  is refused, all of them named `key: old → new` in one line, unless `--allow-change=KEY,...` names
  it (then recorded in provenance.jsonl). Exempt, each with its reason: `UNCHANGING` (how far the
  run goes, where it lives, what it writes and prints) and `LAYOUT` (where arrays sit, how they are
  split or recomputed: the same maths, reductions possibly in another order). Paths inside the run
  directory compare relative to it, so a run directory moved or copied resumes as the same run.
"""

from __future__ import annotations

import json
import os
import shutil

from dart_jax.errors import UserError
from dart_jax.rollout.agent import LAYOUT_ONLY
from dart_jax.run.spec import SECTIONS, TOP_LEVEL, SFTSettings, defaults

RUN_CONFIG = "run_config.json"
PROVENANCE = "provenance.jsonl"  # run.provenance: which code and machine wrote each (re)start
RECORDS = ("metrics.jsonl", "rollouts.jsonl")
RECORD_DIRS = ("checkpoints", "tb")
# The one list of the settings a resume may change without --allow-change, and why. Every other setting
# the trainers read (run.spec's sections, the top-level fields) that differs from run_config.json is
# refused unless --allow-change names it (`check_resume`).
UNCHANGING = {  # how far the run goes, where it lives, what it writes and prints: never what it computes
    "train.steps": "how far the run goes: continuing it is what a resume is for",
    "sft.epochs": "how far the warm start goes (unless the lr schedule spans the SFT length: optim.total_steps=0 "
                  "with a schedule that is not constant; then --allow-change=sft.epochs)",
    "output.dir": "where the run lives: a moved or copied run directory is the same run (paths inside it "
                  "compare relative to it)",
    "output.progress": "what is printed",
    "output.tensorboard": "a second copy of the metrics",
    "output.checkpoint_every": "when checkpoints are written",
    "output.keep": "how many checkpoints are kept",
    "output.export_adapters": "what is written after the last step",
    "output.save_rollouts": "whether trajectories are recorded (no update reads them)",
    "eval.every": "how often the held-out set is rolled out (no update reads it, it draws from its own seed)",
    "eval.batch": "how many held-out questions roll out together (no update reads it)",
    "sft.eval_every": "how often the validation NLL is computed (no update reads it)",
    "train.release_host_memory": "host pages handed back between stages",
}
# where arrays sit, how they are split, shared or recomputed: the same maths (tested equal to the
# unsplit / unsharded computation), though floating-point reductions may run in another order, so a
# resumed run equals an uninterrupted one to rounding rather than bit for bit. Logged when changed.
LAYOUT = {
    "mesh.shape": "how the arrays are sharded over the devices",
    **{f"rollout.{k}": "how rollouts are placed, batched or prefilled (rollout.LAYOUT_ONLY)" for k in LAYOUT_ONLY},
    "model.remat_policy": "what the backward pass recomputes instead of storing",
    "model.causal_block": "query blocks that skip later keys (exact under the position rule)",
    "model.cache_block": "the KV-cache blocks attention reads (unwritten slots are masked either way)",
    "loss.logprob_chunk": "the chunks the log-probs are computed in",
    "loss.logprob_residual": "what the log-probs' backward starts from (the same gradient to rounding)",
    "train.micro_batch_padding": "how wide each micro-batch is padded (padding carries no loss)",
}
RESUMABLE = tuple(UNCHANGING) + tuple(LAYOUT)  # not reported as differences (also by the studies' checks)
RUN_DIR = "<output.dir>"  # how a path inside the run directory is compared


class RunDirError(RuntimeError):
    pass


class ChangedSettings(RunDirError, UserError):
    """--resume with settings that differ from run_config.json and that --allow-change does not name."""


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


def _relative(value, root: str | None):
    """`value` with every path inside the run directory `root` written relative to it (strings in
    lists and dicts too), so that a run directory moved or copied compares as the same run."""
    if isinstance(value, dict):
        return {k: _relative(v, root) for k, v in value.items()}
    if isinstance(value, list):
        return [_relative(v, root) for v in value]
    if root and isinstance(value, str) and value:
        path = os.path.normpath(value)
        if path == root or path.startswith(root.rstrip(os.sep) + os.sep):
            return RUN_DIR + path[len(root):]
    return value


def _comparable(config: dict) -> dict:
    """flat(config) with the paths inside its output.dir relative to it."""
    a = flat(config)
    root = a.get("output.dir")
    root = os.path.normpath(root) if isinstance(root, str) and root else None
    return {k: v if k == "output.dir" else _relative(v, root) for k, v in a.items()}


def changed_settings(saved: dict, current: dict, ignore=RESUMABLE) -> list[tuple[str, object, object]]:
    """(key, old, new) of every leaf that differs, except `ignore`'s ("<absent>" for a missing one). A
    field the saved config lacks (added to the code after that run was written) is no difference when
    the current value is its default (run.spec's dataclasses): the run was trained with that behaviour."""
    a, b = _comparable(saved), _comparable(current)
    known = None
    out = []
    for key in sorted(set(a) | set(b)):
        if key in ignore or a.get(key, "<absent>") == b.get(key, "<absent>"):
            continue
        if key not in a:
            known = setting_defaults() if known is None else known
            if key in known and known[key] == b[key]:
                continue
        out.append((key, a.get(key, "<absent>"), b.get(key, "<absent>")))
    return out


def change_line(key: str, old, new) -> str:
    return f"{key}: {json.dumps(old)} → {json.dumps(new)}"


def config_differences(saved: dict, current: dict, ignore=RESUMABLE) -> list[str]:
    """'field: old → new' for every leaf that differs, except the fields a resume may change (`changed_settings`)."""
    return [change_line(*c) for c in changed_settings(saved, current, ignore)]


def _read_by_trainer(key: str) -> bool:
    """A setting the trainers read: run.spec's sections, `sft`, the top-level fields. A study's own section
    (`cea`, `methods`, …) is read by the study's code, which compares it itself."""
    head = key.split(".", 1)[0]
    return head in SECTIONS or head == "sft" or key in TOP_LEVEL


def allow_list(names, config) -> tuple[str, ...]:
    """--allow-change's keys (a comma list, or a sequence) checked against the settings `config` has or
    the code knows; a key may name a whole section (`optim` allows every optim.*). A name that is no
    setting: a one-line UserError with the closest one."""
    if isinstance(names, str):
        names = names.split(",")
    names = tuple(n.strip() for n in names if n and n.strip())
    keys = set(flat(config_dict(config))) | set(setting_defaults())
    sections = {k.rsplit(".", 1)[0] for k in keys if "." in k}
    for name in names:
        if name not in keys and name not in sections:
            import difflib
            close = difflib.get_close_matches(name, sorted(keys | sections), n=1)
            raise UserError(f"--allow-change={name}: no setting {name}" +
                            (f"; did you mean {close[0]}?" if close else "; name settings as section.field, "
                             "e.g. --allow-change=optim.lr,train.seed"))
    return names


def _allowed(key: str, allow: tuple[str, ...]) -> bool:
    return any(key == a or key.startswith(a + ".") for a in allow)


def check_resume(out_dir: str, config, allow=()) -> list[dict]:
    """--resume of `out_dir` with `config`: refuse (ChangedSettings, one line listing each `key: old → new`)
    every setting the trainers read that differs from run_config.json, unless exempt (`UNCHANGING`,
    `LAYOUT`) or named by `allow` (`allow_list`). Before anything is moved or written.
    -> the changes that go ahead, [{"key", "old", "new", "by": "--allow-change" | "layout" | "unchanging"}]
    (run_config.json absent: [])."""
    allow = allow_list(allow, config)
    saved = saved_config(out_dir)
    if saved is None:
        return []
    changes = [c for c in changed_settings(saved, config_dict(config), ignore=()) if _read_by_trainer(c[0])]
    optim = flat(config_dict(config)).get
    # more SFT epochs stretch an lr schedule that spans the SFT length (optim.total_steps=0, not constant):
    # every remaining step then has another learning rate — a change of the maths, not only of the length
    epochs_change_lr = not optim("optim.total_steps", 100) and optim("optim.schedule", "constant") != "constant"
    exempt = lambda key: key in RESUMABLE and not (key == "sft.epochs" and epochs_change_lr)  # noqa: E731
    refused = [c for c in changes if not exempt(c[0]) and not _allowed(c[0], allow)]
    if refused:
        names = ",".join(c[0] for c in refused)
        raise ChangedSettings(
            f"--resume: {out_dir} was written by a different configuration ({RUN_CONFIG}); this run changes: "
            + "; ".join(change_line(*c) for c in refused) + ". Resume with the original values, or accept the "
            f"change{'s' if len(refused) > 1 else ''} with --allow-change={names} (recorded in {PROVENANCE}), "
            "or start a new run in another output.dir")
    return [{"key": k, "old": old, "new": new,
             "by": "--allow-change" if not exempt(k) else "unchanging" if k in UNCHANGING else "layout"}
            for k, old, new in changes]


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
    """run_config.json: the settings the run's next steps train with (written whole, then renamed: a crash
    leaves the previous one). A resume that changed settings writes it again, so the next resume compares
    with the values the latest steps used."""
    os.makedirs(out_dir, exist_ok=True)
    path = os.path.join(out_dir, RUN_CONFIG)
    with open(path + ".tmp", "w") as f:
        json.dump(config_dict(config), f, indent=1, sort_keys=True)
    os.replace(path + ".tmp", path)


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
