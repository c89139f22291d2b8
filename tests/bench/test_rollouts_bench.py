"""`launch.bench rollouts` end to end at toy size: the lab quickstart's config with a tiny random Llama
(SmolLM2's tokenizer) in place of the warm-started SmolLM2, the real lexical retriever over world 1's
corpus; both sides run every round over the same questions, greedy, and give the same trajectories.
Times are not checked."""

from configs import lab_quickstart
from dart_jax.bench import report
from dart_jax.bench.engine_rollouts import bench_rollouts


def test_rollouts_bench_runs_both_sides(tiny_smollm_dir):
    c = lab_quickstart.get_config()
    c.model.path = tiny_smollm_dir
    c.warm_start = ""
    c.rollout.max_turns = 2
    c.rollout.max_tokens_per_turn = 16
    c.rollout.max_response_tokens = 96
    c.rollout.max_obs_tokens = 32
    c.rollout.engine_segment = 8
    logged = []
    res = bench_rollouts(c, questions=5, slots=2, rounds=1, log=logged.append)
    assert len(logged) == 4  # (compile round + 1) × 2 sides
    assert res["identical_trajectories"] == "5/5"
    assert len(res["batch"]["wall_s"]) == len(res["continuous"]["wall_s"]) == 1
    assert res["speedup"]["min"] > 0
    assert "continuous / batch" in report.text("rollouts", res)
