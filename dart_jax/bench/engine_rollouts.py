"""`launch.bench rollouts`: agentic rollouts on the continuous-batching engine (`rollout.engine=continuous`,
serve.rollouts) against the batch-synchronous agent loop (rollout.agent), on the lab, where rows end
after one to `max_turns` tool calls and pause for the tool at different times.

The policy and rollout settings are a config's (default configs/lab_quickstart.py: SmolLM2-135M with the
lab warm start merged and a fresh routed DART pair, six tool calls, the lexical retriever); the questions
are its held-out check's (world 1, h = 2-3, every operation), searched over `eval.corpus`, greedy. Sides,
on the same questions, in interleaved rounds (batch, gathered, continuous, batch, ...):

  batch       fixed batches of `slots` questions, each batch's turns in lockstep (every turn waits for
              the batch's longest row; the next batch starts when its last row ends), every step over the
              whole batch with a mask (`rollout.gather_rows=0`)
  gathered    the same batches, decoding and appending only the rows still running or appending once
              they fit a smaller bucket of rows (rollout.gather, `rollout.gather_rows=1` here: at any
              batch size)
  continuous  one engine of `slots` rows: a finished row takes the next question at once, tool calls run
              off the decode step

`bench_grpo_rollouts` (`launch.bench grpo_rollouts`) measures GRPO's rollouts the same way: each round one
training step's batch (the config's prompts per step × group size, sampled at its temperature, the
step's seed) through the trainer's rollout stage (rl.stages.rollout) with `rollout.train_engine` batch, then
continuous: one engine row per trajectory, nothing to refill, but no row waits for the batch's longest turn,
rows that finished or paused cost no forward, and a group's prompt is prefilled once.

Round 0 compiles both sides (its times are reported, not compared). Reported per side: wall time per
round, trajectories/s and generated tokens/s; the continuous / batch speed-up per round with its median
and range; and how many trajectories are token-identical between the sides (greedy: all, up to float
rounding between batch shapes flipping a near-tie).
"""

from __future__ import annotations

import copy
import dataclasses
import statistics
import time

import jax

from dart_jax.bench.serve_load import check_map_count
from dart_jax.bench.timing import CompileClock
from dart_jax.rollout.agent import Agent
from dart_jax.rollout.protocol import PROTOCOLS
from dart_jax.rollout.sampling import SamplingConfig
from dart_jax.rollout.tasks import qa_task, sql_task
from dart_jax.run.policy import load_policy
from dart_jax.run.spec import run_spec
from dart_jax.run.task import build_tool, load_eval_rows
from dart_jax.serve.rollouts import continuous_rollouts


def _setup(config, questions: int):
    c = copy.deepcopy(config)
    c.eval.n = int(questions)
    if c.eval.get("corpus"):  # the held-out questions are searched over their own world's corpus
        c.retriever.corpus = c.eval.corpus
        c.retriever.index_dir = ""
    spec = run_spec(c)
    rows = load_eval_rows(spec)
    if len(rows) < questions:
        raise ValueError(f"the config's held-out set has {len(rows)} questions; asked for {questions}")
    protocol = PROTOCOLS[spec.task]
    cfg, base, tok, adapters = load_policy(spec, None, jax.random.PRNGKey(0))
    agent = Agent(cfg, tok, protocol, build_tool(spec, protocol), SamplingConfig(temperature=0.0), spec.rollout,
                  spec.router_convention)
    task_fn = sql_task if protocol.name == "sql" else qa_task
    prompts, uids, metas = task_fn(tok, rows, spec.rollout.prompt_tags)
    return agent, base, adapters, prompts, uids, metas


def _row_ids(tb, i: int) -> list[int]:
    return tb.ids[i, int(tb.prompt_len[i]):int(tb.length[i])].tolist()


def _batch(agent, base, adapters, prompts, uids, metas, slots: int) -> tuple[float, list, int, list]:
    t0 = time.perf_counter()
    ids, tokens, calls = [], 0, []
    for s in range(0, len(prompts), slots):
        tb = agent.rollout(base, adapters, prompts[s:s + slots], uids[s:s + slots], metas[s:s + slots], seed=s)
        ids += [_row_ids(tb, i) for i in range(tb.batch_size)]
        tokens += int(tb.loss_mask.sum())
        calls += tb.tool_calls().tolist()
    return time.perf_counter() - t0, ids, tokens, calls


def _continuous(agent, base, adapters, prompts, uids, metas, slots: int) -> tuple[float, list, int, list]:
    t0 = time.perf_counter()
    ids, tokens, calls = [None] * len(prompts), 0, [0] * len(prompts)
    draws = [(s - s % slots, s % slots) for s in range(len(prompts))]
    for i, tb in continuous_rollouts(agent, base, adapters, prompts, uids, metas, draws, slots):
        ids[i] = _row_ids(tb, 0)
        tokens += int(tb.loss_mask.sum())
        calls[i] = int(tb.tool_calls()[0])
    return time.perf_counter() - t0, ids, tokens, calls


def _net(times: dict[str, list[float]], compiles: dict[str, list[float]]) -> dict:
    """Each timed round's compile seconds per side, and the speed-up with them taken out: a long run
    compiles the engine's row buckets and widths once, a benchmark of a few rounds keeps meeting new ones."""
    net = {k: [w - c for w, c in zip(times[k][1:], compiles[k][1:])] for k in times}
    ups = [b / c for b, c in zip(net["batch"], net["continuous"])]
    return {"compile_s": {k: [round(x, 1) for x in v[1:]] for k, v in compiles.items()},
            "speedup_without_compiles": {"median": round(statistics.median(ups), 3), "min": round(min(ups), 3),
                                         "max": round(max(ups), 3), "per_round": [round(x, 3) for x in ups]}}


def bench_rollouts(config, questions: int = 16, slots: int = 8, rounds: int = 2, log=print) -> dict:
    """`config`: a run config (ml_collections) whose eval set holds ≥ `questions` questions."""
    agent, base, adapters, prompts, uids, metas = _setup(config, questions)
    agents = {}
    for name, g in (("batch", 0), ("gathered", 1), ("continuous", agent.rc.gather_rows)):
        agents[name] = copy.copy(agent)
        agents[name].rc = dataclasses.replace(agent.rc, gather_rows=g)
    sides = {"batch": _batch, "gathered": _batch, "continuous": _continuous}
    times: dict[str, list[float]] = {k: [] for k in sides}
    compiles: dict[str, list[float]] = {k: [] for k in sides}
    out = {}
    for r in range(rounds + 1):
        for name, fn in sides.items():
            with CompileClock() as clock:
                wall, ids, tokens, calls = fn(agents[name], base, adapters, prompts, uids, metas, slots)
            times[name].append(wall)
            compiles[name].append(clock.seconds)
            out[name] = {"ids": ids, "tokens": tokens, "calls": calls}
            log(f"round {r}{' (compiles)' if r == 0 else ''}: {name} {wall:.1f} s ({clock.programs} programs "
                f"compiled in {clock.seconds:.1f} s), {tokens} generated tokens")
    timed = {k: v[1:] for k, v in times.items()}
    speedups = [b / c for b, c in zip(timed["batch"], timed["continuous"])]
    gathered = [b / g for b, g in zip(timed["batch"], timed["gathered"])]
    same = sum(a == b for a, b in zip(out["batch"]["ids"], out["continuous"]["ids"]))
    same_gathered = sum(a == b for a, b in zip(out["batch"]["ids"], out["gathered"]["ids"]))
    calls = out["batch"]["calls"]
    return {
        "config": "lab" if "lab" in str(config.get("warm_start", "")) else str(config.get("warm_start", "")),
        "questions": questions, "slots": slots, "rounds": rounds, "max_turns": agent.rc.max_turns,
        "engine_segment": agent.rc.engine_segment,
        "tool_calls_per_trajectory": {"min": min(calls), "median": statistics.median(calls), "max": max(calls)},
        "compile_round_s": {k: round(v[0], 1) for k, v in times.items()},
        **{k: {"wall_s": [round(x, 1) for x in v], "trajectories_per_s": round(questions / statistics.median(v), 4),
               "generated_tokens_per_s": round(out[k]["tokens"] / statistics.median(v), 1)}
           for k, v in timed.items()},
        "speedup": {"median": round(statistics.median(speedups), 3), "min": round(min(speedups), 3),
                    "max": round(max(speedups), 3), "per_round": [round(s, 3) for s in speedups]},
        "gathered_speedup": {"median": round(statistics.median(gathered), 3), "min": round(min(gathered), 3),
                             "max": round(max(gathered), 3), "per_round": [round(s, 3) for s in gathered]},
        **_net(times, compiles),
        "identical_trajectories": f"{same}/{questions}",
        "gathered_identical_trajectories": f"{same_gathered}/{questions}",
    }


def bench_grpo_rollouts(config, rounds: int = 2, log=print) -> dict:
    """`config`: a GRPO run config. Round r rolls out a step's batch on both sides: the next
    `prompts_per_step` training questions in the trainer's order (rl.trainer.DataStream) × `group_size`
    samples, with a seed of its own."""
    from dart_jax.rl.stages import rollout
    from dart_jax.rl.trainer import DataStream
    from dart_jax.run.task import load_task_rows
    spec = run_spec(copy.deepcopy(config))
    tc = spec.train
    protocol = PROTOCOLS[spec.task]
    cfg, base, tok, adapters = load_policy(spec, None, jax.random.PRNGKey(0))
    # the engine compiles per row bucket and width: past vm.max_map_count XLA:CPU fails mid-run
    check_map_count((tc.prompts_per_step * tc.group_size,), cfg.num_layers, who="launch.bench grpo_rollouts",
                    max_obs_tokens=spec.rollout.max_obs_tokens)
    tool = build_tool(spec, protocol)
    agents = {name: Agent(cfg, tok, protocol, tool, spec.sampling, dataclasses.replace(spec.rollout, train_engine=name),
                          spec.router_convention) for name in ("batch", "continuous")}
    rows = load_task_rows(spec)
    stream = DataStream(len(rows), tc.seed, tc.shuffle)
    key = jax.random.PRNGKey(tc.seed)
    times: dict[str, list[float]] = {k: [] for k in agents}
    compiles: dict[str, list[float]] = {k: [] for k in agents}
    same, total, tokens, calls = 0, 0, {k: 0 for k in agents}, []
    for r in range(rounds + 1):
        step_rows = [rows[i] for i in stream.take(tc.prompts_per_step)]
        seed = int(jax.random.randint(jax.random.fold_in(key, r), (), 0, 2 ** 31 - 1))
        ids = {}
        for name, agent in agents.items():
            t0 = time.perf_counter()
            with CompileClock() as clock:
                ro = rollout(agent, (base, adapters), step_rows, tc.group_size, seed)
            times[name].append(time.perf_counter() - t0)
            compiles[name].append(clock.seconds)
            ids[name] = [_row_ids(ro.tb, i) for i in range(ro.tb.batch_size)]
            if r:
                tokens[name] += int(ro.tb.loss_mask.sum())
            if name == "batch" and r:
                calls += ro.tb.tool_calls().tolist()
            log(f"round {r}{' (compiles)' if r == 0 else ''}: {name} {times[name][-1]:.1f} s ({clock.programs} "
                f"programs compiled in {clock.seconds:.1f} s), {int(ro.tb.loss_mask.sum())} generated tokens")
        if r:
            same += sum(a == b for a, b in zip(ids["batch"], ids["continuous"]))
            total += len(ids["batch"])
    timed = {k: v[1:] for k, v in times.items()}
    speedups = [b / c for b, c in zip(timed["batch"], timed["continuous"])]
    n = tc.prompts_per_step * tc.group_size
    return {
        "config": str(config.get("warm_start", "")), "prompts_per_step": tc.prompts_per_step,
        "group_size": tc.group_size, "temperature": float(spec.sampling.temperature), "rounds": rounds,
        "max_turns": spec.rollout.max_turns, "engine_segment": spec.rollout.engine_segment,
        "tool_calls_per_trajectory": {"min": min(calls), "median": statistics.median(calls), "max": max(calls)},
        "compile_round_s": {k: round(v[0], 1) for k, v in times.items()},
        **{k: {"wall_s": [round(x, 1) for x in v], "trajectories_per_s": round(n / statistics.median(v), 4),
               "generated_tokens_per_s": round(tokens[k] / sum(v), 1)} for k, v in timed.items()},
        "speedup": {"median": round(statistics.median(speedups), 3), "min": round(min(speedups), 3),
                    "max": round(max(speedups), 3), "per_round": [round(x, 3) for x in speedups]},
        **_net(times, compiles),
        "identical_trajectories": f"{same}/{total}",
    }
