"""`launch.bench rollouts` and `grpo_rollouts` end to end at toy size: the lab quickstart's config with a
tiny random Llama (SmolLM2's tokenizer) in place of the warm-started SmolLM2, the real lexical retriever
over world 1's corpus; both sides run every round over the same questions (greedy; GRPO's at T = 1) and
give the same trajectories (batch with every row, batch with the running rows gathered, the engine).
Times are not checked."""

from configs import lab_quickstart
from dart_jax.bench import report
from dart_jax.bench.engine_rollouts import bench_grpo_rollouts, bench_rollouts


def _tiny(tiny_smollm_dir):
    c = lab_quickstart.get_config()
    c.model.path = tiny_smollm_dir
    c.warm_start = ""
    c.rollout.max_turns = 2
    c.rollout.max_tokens_per_turn = 16
    c.rollout.max_response_tokens = 96
    c.rollout.max_obs_tokens = 32
    c.rollout.engine_segment = 8
    return c


def test_rollouts_bench_runs_both_sides(tiny_smollm_dir):
    c = _tiny(tiny_smollm_dir)
    logged = []
    res = bench_rollouts(c, questions=5, slots=2, rounds=1, log=logged.append)
    assert len(logged) == 6  # (compile round + 1) × 3 sides
    assert res["identical_trajectories"] == res["gathered_identical_trajectories"] == "5/5"
    assert len(res["batch"]["wall_s"]) == len(res["gathered"]["wall_s"]) == len(res["continuous"]["wall_s"]) == 1
    assert res["speedup"]["min"] > 0 and res["gathered_speedup"]["min"] > 0
    text = report.text("rollouts", res)
    assert "continuous / batch" in text and "gathered / batch" in text


def test_grpo_rollouts_bench_runs_the_training_stage_on_both_sides(tiny_smollm_dir):
    c = _tiny(tiny_smollm_dir)
    c.train.prompts_per_step, c.train.group_size, c.train.mini_batch, c.train.micro_batch = 2, 3, 6, 3
    c.sampling.temperature = 1.0
    logged = []
    res = bench_grpo_rollouts(c, rounds=1, log=logged.append)
    assert len(logged) == 4 and (res["prompts_per_step"], res["group_size"]) == (2, 3)
    assert res["identical_trajectories"] == "6/6"  # same draws per row at T = 1
    assert res["speedup"]["min"] > 0
    assert "continuous / batch" in report.text("grpo_rollouts", res)
