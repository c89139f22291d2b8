"""python -m launch.rollout --model smollm2-135m-instruct --task qa|sql --n 4 [--adapters DIR]"""

from __future__ import annotations

import argparse
import sys

from dart_jax.rollout.demo import describe, run_rollout_demo


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description="print a few real agentic trajectories")
    ap.add_argument("--model", default="smollm2-135m-instruct")
    ap.add_argument("--task", choices=["qa", "sql"], default="qa")
    ap.add_argument("--n", type=int, default=4)
    ap.add_argument("--offset", type=int, default=0, help="first dataset row")
    ap.add_argument("--adapters", default=None, help="DART adapter directory")
    ap.add_argument("--temperature", type=float, default=1.0)
    ap.add_argument("--max-turns", type=int, default=2)
    ap.add_argument("--max-tokens-per-turn", type=int, default=128)
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args(argv)
    tb, rewards = run_rollout_demo(args.model, args.task, args.n, args.adapters, args.temperature, args.max_turns,
                                   args.max_tokens_per_turn, args.seed, args.offset)
    print(describe(tb, rewards))
    print(f"mean reward {sum(rewards) / len(rewards):+.3f} over {len(rewards)} trajectories")
    return 0


if __name__ == "__main__":
    sys.exit(main())
