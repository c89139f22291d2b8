"""Rollouts on the continuous-batching engine (serve.engine): `rollout.engine=continuous` for evaluation
(`continuous_rollouts`: a stream of questions on a fixed number of rows, eval.runner) and
`rollout.train_engine=continuous` for GRPO's rollouts (`engine_batch`: one step's batch, returned as the
batch sampler returns it, rl.stages.rollout).

The batch sampler (rollout.agent.Agent.run) decodes a batch's turns in lockstep: every turn waits for
the batch's longest row, and the next batch starts when the last row of this one ends. On agentic
rollouts rows end after 1 to `max_turns` tool calls, so most of a batch's rows idle while a few finish.
Here the same rows are requests to an engine of `slots` rows: a finished row is refilled with the next
question at once and a row's tool call runs while the others decode.

Each row draws what it would in its batch: row r of a batch sampled with seed s is the request (seed s,
row r) (serve.requests.Request.row), so greedy and sampled trajectories are the batch sampler's, up to
floating-point differences between batch shapes (tests/serve/test_rollouts.py).
"""

from __future__ import annotations

import logging
from typing import Iterator

import jax
import jax.numpy as jnp
import numpy as np

from dart_jax.adapters.method import TwoModels
from dart_jax.roles.router import route_roles
from dart_jax.rollout.agent import Agent
from dart_jax.rollout.gather import map_count_holds
from dart_jax.rollout.sampler import bucket, cache_bucket
from dart_jax.rollout.trajectory import TrajectoryBatch, assemble, concat_batches
from dart_jax.serve.engine import Engine
from dart_jax.serve.requests import Generation, Request
from dart_jax.serve.slots import obs_width

log = logging.getLogger(__name__)


def check_engine(agent: Agent, composition=None, processes: int = 1, base=None,
                 setting: str = "rollout.engine") -> None:
    """Refuse, naming why and `setting`, a rollout the engine cannot run: a two-model composition
    (`composition`, or a 2-Agent policy's `base`), several processes or a mesh of several devices (the
    engine decodes on one)."""
    why = []
    if composition or isinstance(base, TwoModels):
        why.append("a two-model composition (CEA's H_Tool / H_Reas, 2-Agent) decodes batch-synchronously")
    if processes > 1:
        why.append(f"{processes} processes (the engine serves one)")
    placement = agent.spec.placement
    if placement is not None and placement.mesh.devices.size > 1:
        why.append(f"a mesh of {placement.mesh.devices.size} devices (the engine decodes on one)")
    if why:
        raise ValueError(f"{setting}=continuous: " + "; ".join(why) + f". Use {setting}=batch")

# programs an engine compiles over a run: row buckets × (prompt widths, observation widths, decode), and the
# batch loop's and the update's beside it (a lab GRPO run on 16 rows: ~160)
MIN_PROGRAMS = 200
_WARNED: set[str] = set()


def engine_fits(layers: int, setting: str, path: str = "/proc/sys/vm/max_map_count") -> bool:
    """Whether the engine can compile its programs here: False, warned once a process, where XLA:CPU's
    memory-map limit holds fewer than MIN_PROGRAMS of this model's (past the limit LLVM fails mid-run,
    "Cannot allocate memory" with RAM to spare). The caller then decodes batch-synchronously: the same
    trajectories, slower."""
    got = map_count_holds(layers, path)
    if got is None or got[1] >= MIN_PROGRAMS:
        return True
    if setting not in _WARNED:
        _WARNED.add(setting)
        log.warning("%s=continuous: on XLA:CPU vm.max_map_count = %d holds ~%d compiled programs of this %d-layer "
                    "model, fewer than the engine compiles (~%d; past the limit XLA fails mid-run with \"Cannot "
                    "allocate memory\"), so these rollouts decode batch-synchronously (the same trajectories, "
                    "slower). To use the engine: sudo sysctl -w vm.max_map_count=1048576", setting, got[0], got[1],
                    layers, MIN_PROGRAMS)
    return False


def prompt_routes(agent: Agent, prompt: list[int]) -> list[int]:
    """The adapter route of each prompt position, as the engine's prefill computed it."""
    tokens = jnp.asarray([prompt], jnp.int32)
    return np.asarray(agent.spec.routes(route_roles(tokens, agent.spec.router, tokens >= 0)))[0].tolist()


def trajectory(agent: Agent, gen: Generation, uid=None) -> TrajectoryBatch:
    """A finished generation as a one-row TrajectoryBatch (what Agent.run returns for that row)."""
    prompt = list(gen.request.prompt)
    resp = {"ids": gen.ids, "mask": gen.mask, "logprobs": gen.logprobs, "routes": gen.routes}
    texts, rewards, observed = agent.texts([resp], [gen.spans])
    uid = gen.uid if uid is None else uid
    return assemble([prompt], [prompt_routes(agent, prompt)], [resp], [uid], [gen.finish], [gen.turns], texts,
                    reward_texts=rewards, observed=observed)


def continuous_rollouts(agent: Agent, base, adapters, prompts: list[list[int]], uids: list, metas: list[dict],
                        draws: list[tuple[int, int]], slots: int, tool=None,
                        capacity: int = 0, log_level: int = logging.INFO) -> Iterator[tuple[int, TrajectoryBatch]]:
    """Roll out `prompts` on an engine of `slots` rows -> yields (index, its one-row TrajectoryBatch) as each
    finishes (not in order). `draws[i]`: (seed, row) of prompt i's draws; `tool`: the ToolFn (None: the
    agent's). Sampling settings are the agent's; a row's error (a failing tool) is raised. `capacity`: KV
    slots per row allocated up front (Engine; 0: grown on demand); `log_level`: of the closing summary line."""
    engine = Engine(agent, base, adapters, slots=slots, segment=agent.rc.engine_segment, tool=tool,
                    max_waiting=len(prompts) + 1, share_identical=agent.rc.share_prompt_prefill, capacity=capacity)
    sampling = agent.sampling
    try:
        gens = [engine.submit(Request(tuple(p), temperature=float(sampling.temperature), top_p=float(sampling.top_p),
                                      seed=int(seed), row=int(row), meta=dict(meta)))
                for p, meta, (seed, row) in zip(prompts, metas, draws)]
        pending = list(range(len(gens)))
        while pending:
            busy = engine.step()
            still = []
            for i in pending:
                g = gens[i]
                if not g.done():
                    still.append(i)
                elif g.error is not None:
                    raise g.error
                else:
                    yield i, trajectory(agent, g, uids[i])
            pending = still
            if pending and not busy:
                raise RuntimeError(f"the engine went idle with {len(pending)} rollouts unfinished")
        log.log(log_level, "continuous rollouts: %d rows on %d slots, %d decode segments, %d admissions, %d appends, "
                "%d rows from a prompt prefilled once for its group", len(gens), slots, engine.stats["segments"],
                engine.stats["admits"], engine.stats["appends"], engine.stats["group_admitted"])
    finally:
        engine.close()
        # the engine's phase seconds in the agent's account (Agent.time): decode (its tool calls overlap it:
        # not apart), append, admit; no steps or fill (its rows refill as they finish)
        for k, v in engine.time.items():
            agent.time[f"{k}_s"] += v


def engine_batch(agent: Agent, base, adapters, prompts: list[list[int]], uids: list, metas: list[dict] | None,
                 seed: int, row_offset: int = 0) -> TrajectoryBatch:
    """What `Agent.run` returns for this batch (rows [row_offset, …) of a batch sampled with `seed`), rolled
    out on an engine with a row per prompt: a row whose turn ended does not wait for the others' turns,
    and rows that finished or paused for the tool cost no forward (serve.engine). Same draws per row, so
    the same trajectories up to floating-point differences between batch shapes."""
    check_engine(agent, processes=jax.process_count(), base=base, setting="rollout.train_engine")
    metas = metas if metas is not None else [{} for _ in prompts]
    draws = [(seed, row_offset + i) for i in range(len(prompts))]
    # every row's most (a prompt fills its width bucket's slots): a step's engine is new, so a cache grown
    # on demand would be copied and its programs compiled at each capacity it passes, step after step
    rc = agent.rc
    capacity = cache_bucket(cache_bucket(max(map(len, prompts))) + rc.max_response_tokens
                            + obs_width(rc.max_obs_tokens) + bucket(rc.engine_segment) + 1)
    out: list[TrajectoryBatch | None] = [None] * len(prompts)
    for i, tb in continuous_rollouts(agent, base, adapters, prompts, uids, metas, draws, slots=len(prompts),
                                     capacity=capacity, log_level=logging.DEBUG):  # every step: no line
        out[i] = tb
    return concat_batches(out)
