"""The method comparison reads each evaluation's per_question.jsonl (or the archived .gz) as the run's
other readers do: a last line cut short by a crash mid-write is skipped and logged, so the report
counts the questions that were recorded whole."""

import gzip
import json

from dart_jax.experiments import methods_report


def test_a_torn_last_per_question_line_is_skipped(tmp_path, caplog):
    recs = [{"dataset": "nq", "id": i, "score": float(i % 2)} for i in range(5)]
    text = "".join(json.dumps(r) + "\n" for r in recs) + '{"dataset": "nq", "id": 5, "sco'
    (tmp_path / "live").mkdir()
    (tmp_path / "live" / "per_question.jsonl").write_text(text)
    (tmp_path / "archived").mkdir()
    with gzip.open(tmp_path / "archived" / "per_question.jsonl.gz", "wt") as f:
        f.write(text)
    for d in ("live", "archived"):
        assert methods_report._eval_counts(str(tmp_path / d), ["nq"]) == {"nq": (2, 5)}
    assert sum("cut short" in r.getMessage() for r in caplog.records) == 2


def _eval_dir(root, name: str, correct: list[int], skills: dict) -> str:
    d = root / name
    d.mkdir()
    recs = [{"dataset": "lab_world1", "id": i, "score": float(c)} for i, c in enumerate(correct)]
    (d / "per_question.jsonl").write_text("".join(json.dumps(r) + "\n" for r in recs))
    pooled = {f"lab/{k}": v for k, v in skills.items()}
    (d / "results.json").write_text(json.dumps({"datasets": {"lab_world1": {"lab": {"pooled": pooled}}}}))
    return str(d)


def test_role_skills_per_run_and_their_shift_beyond_the_seed_spread(tmp_path):
    """The report reads each lab evaluation's pooled role skills; a skill moved 'beyond the seed spread'
    when the warm start's value lies outside the seeds' range (hand-made values)."""
    train = tmp_path / "train"
    train.mkdir()
    (train / "metrics.jsonl").write_text(json.dumps({"step": 1, "reward/mean": 0.5}) + "\n")
    ref = _eval_dir(tmp_path, "ws", [1, 0, 0, 0], {"tool_skill": 0.40, "reasoning_skill": 0.50})
    runs = {f"dart_s{s}": {"method": "dart", "seed": s, "train": str(train),
                           "eval": _eval_dir(tmp_path, f"e{s}", [1, 1, 0, 0],
                                             {"tool_skill": t, "reasoning_skill": r})}
            for s, (t, r) in enumerate([(0.55, 0.45), (0.60, 0.60), (0.52, 0.50)])}
    summary = methods_report.write_report(runs, str(tmp_path / "report"), ["lab_world1"], reference=ref)
    shifts = {q["skill"]: q for q in summary["skill_shifts"]}
    assert shifts["tool_skill"]["beyond_seed_spread"] is True  # 0.40 below [0.52, 0.60]
    assert shifts["tool_skill"]["per_seed"] == [0.55, 0.60, 0.52]
    assert abs(shifts["tool_skill"]["mean"] - 0.5566667) < 1e-6
    assert shifts["reasoning_skill"]["beyond_seed_spread"] is False  # 0.50 inside [0.45, 0.60]
    assert summary["paired"][0]["only_a"] == 1 and summary["paired"][0]["both"] == 1  # question 1 gained
    report = (tmp_path / "report" / "report.md").read_text()
    assert "## Role skills (lab sets)" in report and "| dart | lab_world1 | tool_skill | 0.400 |" in report
