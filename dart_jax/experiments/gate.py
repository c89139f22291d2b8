"""The degeneracy gate of a study (launch.cea, launch.grad_angles, launch.methods): whether the trajectories it
sampled show a template (questions copied into the tool, one <think> sentence, one tool-call shape: lab.metrics
`surface_metrics` / `degeneracy_gate`) rather than skills. A study run on such a setting measures nothing, so
each study gates every set of trajectories it sampled (a CEA variant, a methods run, the gradient study's
rollouts) from the files it saved, so a resumed study is gated as a fresh one:

    warn    (default) flag it loudly: a warning, the verdict in the results (summary.json "degeneracy_gate") and
            a line "degeneracy gate: …" at the top of report.md;
    strict  refuse, with a UserError naming the reasons, as soon as the first sampled set shows it (before the
            study's expensive part: training, the other variants, the gradients);
    off     not computed."""

from __future__ import annotations

import json
import logging
import os

import jax

from dart_jax.errors import UserError
from dart_jax.lab.metrics import degeneracy_gate, finite, surface_metrics
from dart_jax.run.records import read_records as _read

log = logging.getLogger(__name__)

MODES = ("warn", "strict", "off")
KEY = "degeneracy_gate"


def check_mode(mode: str) -> str:
    if mode not in MODES:
        raise UserError(f"gate {mode!r}: expected one of {MODES} (--gate)")
    return mode


def read_records(path: str) -> list[dict]:
    """The records of a .jsonl or .jsonl.gz file ([] when it does not exist): run.records' tolerant reader
    (a last line cut short by a crash is skipped, logged)."""
    return _read(path) if os.path.isfile(path) else []


def eval_records(eval_dir: str) -> list[dict]:
    """An evaluation directory's per-question records (eval.job's per_question.jsonl, or an archive's .gz)."""
    path = os.path.join(eval_dir, "per_question.jsonl")
    return read_records(path if os.path.isfile(path) else path + ".gz")


def study_gate(sets: dict[str, list[dict]], questions=None) -> dict:
    """{name: records} -> {"flagged", "reasons": ["name: reason"], "sets": {name: {"metrics", "reasons"}}}: each
    set gated on its own (each is one policy's trajectories)."""
    out: dict = {"flagged": False, "reasons": [], "sets": {}}
    for name, records in sets.items():
        m = surface_metrics(records, questions)
        reasons = degeneracy_gate(m)
        out["sets"][name] = {"metrics": finite(m), "reasons": reasons}
        out["reasons"] += [f"{name}: {r}" for r in reasons]
    out["flagged"] = bool(out["reasons"])
    return out


def line(gate: dict) -> str:
    """The report's one line on the verdict."""
    if gate.get("mode") == "off":
        return "degeneracy gate: off (not checked)"
    if gate["flagged"]:
        return ("**degeneracy gate: FLAGGED — these trajectories fill a template; the results below measure no "
                "role skill** (" + "; ".join(gate["reasons"]) + ")")
    return f"degeneracy gate: passed ({', '.join(gate['sets']) or 'no trajectories'})"


def enforce(gate: dict, mode: str, study: str) -> dict:
    """strict: a UserError when flagged; warn: a loud warning. -> the gate, its mode recorded."""
    gate["mode"] = mode
    if gate["flagged"]:
        msg = f"{study} degeneracy gate: " + "; ".join(gate["reasons"])
        if mode == "strict":
            raise UserError(msg + ". The setting measures no role skill: fix the warm start / retriever / task, or "
                                  "run with --gate=warn to only flag it")
        log.warning("!!! %s !!! (the results of this setting measure no role skill)", msg)
    return gate


def add_to_report(report_dir: str, gate: dict) -> None:
    """The verdict into `report_dir`/summary.json ("degeneracy_gate") and as a line under report.md's title
    (process 0 writes)."""
    if jax.process_index() != 0:
        return
    path = os.path.join(report_dir, "summary.json")
    if os.path.isfile(path):
        with open(path) as f:
            summary = json.load(f)
        summary[KEY] = gate
        with open(path + ".tmp", "w") as f:
            json.dump(summary, f, indent=1)
        os.replace(path + ".tmp", path)
    path = os.path.join(report_dir, "report.md")
    if os.path.isfile(path):
        with open(path) as f:
            lines = f.read().split("\n")
        at = 1 if lines and lines[0].startswith("#") else 0
        lines[at:at] = ["", line(gate)]
        with open(path, "w") as f:
            f.write("\n".join(lines))
