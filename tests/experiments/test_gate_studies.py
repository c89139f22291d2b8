"""The degeneracy gate (experiments.gate) inside the study commands: the gradient study's saved rollouts (hand
written, the real NQ questions of its pool) gated by `launch.grad_angles` — the verdict in report/summary.json,
report.md and the command's output, strict refusing before any gradient — and CEA and the methods comparison
under strict on a tiny random Llama with SmolLM2's real tokenizer: the warm start's trajectories are sampled
first and refused before any training."""

import json

import numpy as np
import pytest
from test_cea_run import _config as cea_config
from test_methods_run import _args as methods_args

from configs import grad_angles_quickstart
from dart_jax.errors import UserError
from dart_jax.experiments.cea_run import CEAStages
from dart_jax.experiments.gate import KEY
from dart_jax.experiments.grad_run import Study
from launch import grad_angles as launch_ga, methods as launch_methods

G = 4


def _grad_config(out):
    c = grad_angles_quickstart.get_config()
    c.grad_angles.update(dict(out=str(out), limit=3, queries=2, chunk=3, group_size=G, authors_k=3, min_n=2))
    return c


def _write_rollouts(out, rows: list[dict], response) -> None:
    """One chunk as the sample stage writes it: G trajectories per row (texts from `response(row, i)`), each
    group mixed (right on 0 and 3). The arrays are placeholders: the gate reads the texts."""
    d = out / "rollouts"
    d.mkdir(parents=True, exist_ok=True)
    n = len(rows) * G
    acc = np.tile(np.array([1.0, 0.0, 0.0, 1.0], np.float32), len(rows))
    np.savez(d / "chunk_000.npz", ids=np.zeros((n, 4), np.int32), positions=np.tile(np.arange(4), (n, 1)),
             loss_mask=np.ones((n, 4), np.float32), scores=acc, accuracy=acc,
             uids=np.asarray([r["id"] for r in rows]), group_size=G, seed=0)
    with open(d / "chunk_000.jsonl", "w") as f:
        for r in rows:
            for i in range(G):
                f.write(json.dumps({"uid": r["id"], "score": float(acc[i]), "accuracy": float(acc[i]),
                                    "response": response(r, i)}) + "\n")


def _template(row, i):
    return (f"<think> I need to look this up. </think>\n<search> {row['question']} </search>\n\n"
            "<information>Doc 1(Title: Somebody) a passage</information>\n\n<answer> x </answer>")


def _varied(row, i):
    return (f"<think> Attempt {i} on {row['id']}: the question names an entity. </think>\n<search> entity {i} of "
            f"{row['id']} </search>\n\n<information>Doc 1(Title: Somebody) a passage</information>\n\n"
            f"<think> The passage gives {i}. </think><answer> x </answer>")


def _args(out, *more):
    return ["--config=configs/grad_angles_quickstart.py", f"--config.grad_angles.out={out}",
            "--config.grad_angles.limit=3", "--config.grad_angles.queries=2", "--config.grad_angles.chunk=3",
            f"--config.grad_angles.group_size={G}", "--config.grad_angles.authors_k=3", *more]


def test_grad_angles_gate_reaches_the_report_and_strict_refuses(tmp_path, capsys):
    out = tmp_path / "template"
    rows = Study(_grad_config(out))._pool()
    assert len(rows) == 3
    _write_rollouts(out, rows, _template)
    # strict: the grads stage refuses the template rollouts before any gradient (no policy is loaded)
    with pytest.raises(UserError, match="grad_angles degeneracy gate: rollouts: question-copy rate 1.000 > 0.10"):
        launch_ga.main(_args(out, "--stage=grads", "--gate=strict"))
    assert not any((out / "grads").rglob("*.npz"))
    # warn: the report carries the verdict (12 trajectories: 12 copies, one <think> span 12 times)
    assert launch_ga.main(_args(out, "--stage=report")) == 0
    summary = json.load(open(out / "report" / "summary.json"))
    gate = summary[KEY]
    assert gate["flagged"] and gate["mode"] == "warn"
    m = gate["sets"]["rollouts"]["metrics"]
    assert (m["lab/trajectories"], m["lab/copy_rate"], m["lab/think_spans"], m["lab/distinct_think"]) == \
        (12, 1.0, 12, 1)
    assert [r.split(" ")[1] for r in gate["reasons"]] == ["question-copy", "only", "the"]
    report = open(out / "report" / "report.md").read().splitlines()
    assert report[2].startswith("**degeneracy gate: FLAGGED") and "rollouts: question-copy rate 1.000" in report[2]
    assert "degeneracy gate: FLAGGED" in capsys.readouterr().out
    # off: not computed
    assert launch_ga.main(_args(out, "--stage=report", "--gate=off")) == 0
    assert KEY not in json.load(open(out / "report" / "summary.json"))
    # a varied setting passes, strict included
    ok = tmp_path / "varied"
    _write_rollouts(ok, rows, _varied)
    assert launch_ga.main(_args(ok, "--stage=report", "--gate=strict")) == 0
    gate = json.load(open(ok / "report" / "summary.json"))[KEY]
    # 24 spans: 12 "Attempt i on <id>" and "The passage gives i" for i < 4
    assert not gate["flagged"] and gate["sets"]["rollouts"]["metrics"]["lab/distinct_think"] == 12 + 4
    assert "degeneracy gate: passed (rollouts)" in open(ok / "report" / "report.md").read()


def test_cea_strict_refuses_a_template_warm_start_before_training(tiny_smollm_dir, tmp_path):
    """A random model writes no <think> span: under strict, the train stage samples M_Base first, gates it and
    refuses; no variant is trained."""
    out = tmp_path / "cea"
    stages = CEAStages(cea_config(tiny_smollm_dir, out), gate="strict")
    with pytest.raises(UserError, match=r"CEA degeneracy gate: base: no <think> span in 4 trajectories"):
        stages.train()
    assert (out / "sample" / "base" / "per_question.jsonl").is_file() and not (out / "train").exists()
    # the saved sample is gated again on resume (warn: flagged, not refused), and the sample stage skips it
    warn = CEAStages(cea_config(tiny_smollm_dir, out))
    gate = warn.check_gate(("base",))
    assert gate["flagged"] and gate["mode"] == "warn" and gate["sets"]["base"]["metrics"]["lab/trajectories"] == 4
    with pytest.raises(ValueError, match="gate 'loud'"):
        CEAStages(cea_config(tiny_smollm_dir, out), gate="loud")


def test_methods_strict_refuses_a_template_warm_start_before_training(tiny_smollm_dir, tmp_path):
    """`launch.methods --gate=strict`: the warm start (the reference) is evaluated before the train stage, its 4
    greedy trajectories (2 questions × 2 sets) gated, the comparison refused; no run is trained."""
    out = tmp_path / "methods"
    with pytest.raises(UserError, match="methods degeneracy gate: warm_start: no <think> span in 4 trajectories"):
        launch_methods.main(methods_args(tiny_smollm_dir, out) + ["--gate=strict"])
    assert (out / "eval" / "warm_start" / "per_question.jsonl").is_file() and not (out / "train").exists()
