"""python -m launch.rollout --model smollm2-135m-instruct --task qa|sql --n 4 [--adapters DIR] [--no-warm-start]

QA on the embedded SmolLM2 starts from the shipped warm start (the raw model never writes the tags:
--no-warm-start shows that); --warm-start DIR merges another one."""

from __future__ import annotations

import argparse
import sys

from dart_jax.rollout.demo import default_warm_start, describe, run_rollout_demo


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description="print a few real agentic trajectories")
    ap.add_argument("--model", default="smollm2-135m-instruct")
    ap.add_argument("--task", choices=["qa", "sql"], default="qa")
    ap.add_argument("--n", type=int, default=4)
    ap.add_argument("--offset", type=int, default=0, help="first dataset row")
    ap.add_argument("--adapters", default=None, help="DART adapter directory")
    ap.add_argument("--warm-start", default=None, help="warm-start directory merged first (default: the shipped "
                                                         "one for smollm2-135m-instruct QA)")
    ap.add_argument("--no-warm-start", action="store_true", help="the raw model, no warm start")
    ap.add_argument("--temperature", type=float, default=1.0)
    ap.add_argument("--max-turns", type=int, default=2)
    ap.add_argument("--max-tokens-per-turn", type=int, default=128)
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args(argv)
    warm = "" if args.no_warm_start else (args.warm_start or default_warm_start(args.model, args.task))
    if warm:
        print(f"warm start: {warm} (merged into {args.model}; --no-warm-start for the raw model)")
    elif not args.no_warm_start:
        print(f"no warm start is shipped for {args.model} / {args.task}: the raw model may never write the tags")
    tb, rewards = run_rollout_demo(args.model, args.task, args.n, args.adapters, args.temperature, args.max_turns,
                                   args.max_tokens_per_turn, args.seed, args.offset, warm)
    print(describe(tb, rewards))
    print(f"mean reward {sum(rewards) / len(rewards):+.3f} over {len(rewards)} trajectories")
    return 0


if __name__ == "__main__":
    sys.exit(main())
