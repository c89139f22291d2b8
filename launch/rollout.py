"""Print a few real agentic trajectories: the model, the sampler with its tool pauses, the real
retriever or SQLite tool, and the rewards.

    python -m launch.rollout --task=qa --n=4
    python -m launch.rollout --task=sql --n=2 --no-warm-start
    python -m launch.rollout --adapters=runs/quickstart/adapters --temperature=0

The embedded SmolLM2 starts from the shipped warm start of its task, QA or SQL (the raw model never
writes the tags: --no-warm-start shows that); --warm-start=DIR merges another one.
"""

from __future__ import annotations

from absl import flags

from launch._cli import Command

CLI = Command("launch.rollout", __doc__)
F = CLI.flags
MODEL = flags.DEFINE_string("model", "smollm2-135m-instruct", "model name or path", flag_values=F)
TASK = flags.DEFINE_enum("task", "qa", ["qa", "sql"], "retrieval QA or NL2SQL", flag_values=F)
N = flags.DEFINE_integer("n", 4, "trajectories", flag_values=F)
OFFSET = flags.DEFINE_integer("offset", 0, "first dataset row", flag_values=F)
ADAPTERS = flags.DEFINE_string("adapters", None, "a DART adapter directory", flag_values=F)
WARM = flags.DEFINE_string("warm-start", None, "warm-start directory merged first (default: the shipped one for "
                           "smollm2-135m-instruct and the task)", flag_values=F)
NO_WARM = flags.DEFINE_bool("no-warm-start", False, "the raw model, no warm start", flag_values=F)
TEMPERATURE = flags.DEFINE_float("temperature", 1.0, "sampling temperature (0 = greedy)", flag_values=F)
MAX_TURNS = flags.DEFINE_integer("max-turns", 2, "tool calls allowed", flag_values=F)
MAX_TOKENS = flags.DEFINE_integer("max-tokens-per-turn", 128, "generated tokens per turn", flag_values=F)
SEED = flags.DEFINE_integer("seed", 0, "sampling seed", flag_values=F)


def main(argv: list[str] | None = None) -> int:
    CLI.parse(argv)
    from dart_jax.run.demo import default_warm_start, describe, run_rollout_demo
    warm = "" if NO_WARM.value else (WARM.value or default_warm_start(MODEL.value, TASK.value))
    if warm:
        print(f"warm start: {warm} (merged into {MODEL.value}; --no-warm-start for the raw model)")
    elif not NO_WARM.value:
        print(f"no warm start is shipped for {MODEL.value} / {TASK.value}: the raw model may never write the tags")
    tb, rewards = run_rollout_demo(MODEL.value, TASK.value, N.value, ADAPTERS.value, TEMPERATURE.value,
                                   MAX_TURNS.value, MAX_TOKENS.value, SEED.value, OFFSET.value, warm)
    print(describe(tb, rewards))
    print(f"mean reward {sum(rewards) / len(rewards):+.3f} over {len(rewards)} trajectories")
    return 0


if __name__ == "__main__":
    CLI.run(main)
