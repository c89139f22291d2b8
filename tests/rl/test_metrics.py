"""What a run reports: held-out results as counts with a binomial interval, "greedy" only at T = 0,
and the reward plot with the per-step spread and held-out counts."""

import json
import math

import pytest

from dart_jax.rl.trainer import held_out_line, summary
from dart_jax.run.metrics import plot_curves, read_metrics, wilson_interval


def test_wilson_interval_hand_worked():
    # p̂ = 0.25, n = 32: centre (0.25 + 1.96²/64) / (1 + 1.96²/32) = 0.2768, half-width 0.1443
    lo, hi = wilson_interval(8, 32)
    assert (round(lo, 4), round(hi, 4)) == (0.1325, 0.4211)
    assert wilson_interval(0, 10)[0] == 0.0 and wilson_interval(0, 10)[1] == pytest.approx(3.8416 / 13.8416, abs=1e-6)
    assert wilson_interval(10, 10)[1] == 1.0
    assert all(math.isnan(x) for x in wilson_interval(0, 0))


def _row(step, correct, temp=0.0):
    return {"step": step, "eval/n": 32, "eval/scored": 32, "eval/correct": correct, "eval/reward": correct / 32,
            "eval/answer_rate": 1.0, "eval/temperature": temp}


def test_held_out_line_counts_and_names_the_mode():
    line = held_out_line(_row(0, 8), _row(24, 9))
    assert "greedy" in line and "8/32 correct (95% CI 0.13–0.42)" in line and "9/32 correct" in line
    sampled = held_out_line(_row(0, 8, 1.0), _row(24, 9, 1.0))
    assert "greedy" not in sampled and "sampled at T=1" in sampled


def test_plot_draws_spread_and_held_out_counts(tmp_path):
    path = tmp_path / "metrics.jsonl"
    rows = [_row(0, 8)] + [{"step": s, "reward/mean": 0.1 * s, "reward/std": 0.2, "reward/min": 0.0,
                            "reward/max": 1.0, "protocol/answer_rate": 0.9} for s in range(1, 10)] + [_row(9, 9)]
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    out = plot_curves(str(path), str(tmp_path / "curve.png"))
    assert (tmp_path / "curve.png").stat().st_size > 10_000 and out.endswith("curve.png")
    res = {"metrics": str(path), "plot": out, "checkpoints": "c"}
    assert "9/32 correct" in summary(res) and len(read_metrics(str(path))) == 11
