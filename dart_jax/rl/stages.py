"""One GRPO step as three stages with data in and data out; the trainer (`rl/trainer.py`) only
sequences them and owns the files.

    rollout   task rows × G  ──(agent: sampler + tool, current policy)──► Rollouts
    scoring   Rollouts ──(task reward, accuracy, GRPO advantages)──► Scored (+ the train-step arrays)
    update    Scored.batch ──(old / reference log-probs, ppo_epochs × mini-batches of the jitted,
              sharded step)──► new TrainState + one metrics dict per update

Each stage is a plain function or a small object over arrays and config dataclasses, testable alone;
SFT, the analyses and the baselines compose the same stages.
"""

from __future__ import annotations

import dataclasses
import logging
import math
from typing import Any, Callable

import jax
import jax.numpy as jnp
import numpy as np
from jax.sharding import NamedSharding, PartitionSpec as P

from dart_jax.adapters.method import MethodSpec, model_trees
from dart_jax.models.config import ModelConfig
from dart_jax.models.sharding import batch_sharding
from dart_jax.rewards.training import QAReward, SQLReward
from dart_jax.rl import batch as batch_lib
from dart_jax.rl.placement import jit_step, microbatch_sharding
from dart_jax.rl.step import (
    TrainState,
    batch_keys,
    make_micro_step,
    make_scorer,
    make_train_step,
)
from dart_jax.roles.router import REASONING, TOOL, RouterSpec, route_roles
from dart_jax.rollout.agent import Agent
from dart_jax.rollout.compose import rollout_policy
from dart_jax.rollout.tasks import overlong, qa_task, sql_task
from dart_jax.rollout.trajectory import TrajectoryBatch, assemble, concat_batches
from dart_jax.run.held_out import task_accuracy
from dart_jax.run.spec import LossConfig, OptimConfig, UpdatePlan, groups_per_chunk
from dart_jax.serve import rollouts as engine_rollouts

log = logging.getLogger(__name__)


# -- rollout ------------------------------------------------------------------------------------------
@dataclasses.dataclass
class Rollouts:
    tb: TrajectoryBatch
    rows: list[dict]    # the task row of each trajectory (G consecutive copies per prompt)
    metas: list[dict]   # what the reward reads, plus data_source
    overlong: np.ndarray | None = None  # bool[N]: the prompt was refused by the context rule (`refused_rows`)

    def __post_init__(self):
        if self.overlong is None:
            self.overlong = np.zeros(len(self.rows), bool)


def rollout(agent: Agent, trees: tuple[Any, Any], rows: list[dict], group_size: int, seed: int,
            row_offset: int = 0) -> Rollouts:
    """G samples of each row's prompt with the policy `trees` = (base, adapters) (2-Agent: the
    two-model composition). `row_offset`: these are trajectories [row_offset, …) of the step's batch
    (a process's share in a multi-process run). With `rollout.chunk_rows` the share is decoded in
    chunks of at most that many trajectories (whole groups), one after the other, so the KV cache holds
    a chunk's rows, not the share's; each chunk samples with its rows' offset in the batch, so the
    draws, and the trajectories, are the one-batch rollout's.

    Context: a prompt the context rule refuses (rollout.tasks.overlong: len(prompt) + one full turn >
    the model's max_position_embeddings) is never run: its group becomes `refused_rows` (one-token
    rows, no loss), so the batch layout (and mini-batch divisibility) stays the same; the prompts
    around it roll out in runs, each with its own offset, so their draws are unchanged.

    Decoded as `rollout.train_engine` says (the batch loop, or the serving engine: the same draws)."""
    g = group_size
    per_chunk = groups_per_chunk(agent.rc.chunk_rows, g) or max(len(rows), 1)
    task_fn = qa_task if agent.protocol.name == "qa" else sql_task
    context = agent.spec.model.max_position_embeddings
    parts = []
    for start in range(0, len(rows), per_chunk):
        part = rows[start:start + per_chunk]
        prompts, uids, metas = task_fn(agent.tok, part, agent.rc.prompt_tags)
        over = overlong(prompts, context, agent.rc)
        for a, b in runs(over):  # consecutive prompts on the same side of the rule
            rep = lambda xs: [x for x in xs[a:b] for _ in range(g)]  # noqa: E731 (each prompt G times)
            ms = [dict(m, data_source=r.get("data_source", "data")) for m, r in zip(rep(metas), rep(part))]
            if over[a]:
                tb = refused_rows(agent, rep(prompts), rep(uids))
            else:
                decode = engine_rollouts.engine_batch if agent.rc.train_engine == "continuous" else rollout_policy
                tb = decode(agent, trees[0], trees[1], rep(prompts), rep(uids), ms, seed=seed,
                            row_offset=row_offset + (start + a) * g)
            parts.append(Rollouts(tb, rep(part), ms, np.full(tb.batch_size, over[a])))
    return parts[0] if len(parts) == 1 else concat_rollouts(parts)


def runs(flags: list[bool]) -> list[tuple[int, int]]:
    """[a, b) ranges of consecutive equal `flags`, in order."""
    out, a = [], 0
    for i in range(1, len(flags) + 1):
        if i == len(flags) or flags[i] != flags[a]:
            out.append((a, i))
            a = i
    return out


def refused_rows(agent: Agent, prompts: list[list[int]], uids: list) -> TrajectoryBatch:
    """Stand-ins for prompts the context rule refused, built without any forward: each row is its
    prompt's first token alone (routed as the sampler routes it), no response, finish "overlong".
    They keep the refused group's place in the step's batch; scoring gives them no loss."""
    first = [list(p[:1]) for p in prompts]
    routes = np.asarray(agent.spec.routes(route_roles(jnp.asarray(first, jnp.int32), agent.spec.router))).tolist()
    empty = [{"ids": [], "mask": [], "logprobs": [], "routes": []} for _ in prompts]
    return assemble(first, routes, empty, uids, ["overlong"] * len(prompts), [[] for _ in prompts],
                    [""] * len(prompts))


def concat_rollouts(parts: list[Rollouts]) -> Rollouts:
    """Rollouts of consecutive blocks of a step's batch as one: rows right-padded to the longest
    trajectory of all parts (as one rollout of the whole batch pads them), lists joined in order."""
    cat = lambda get: [x for p in parts for x in get(p)]  # noqa: E731
    return Rollouts(concat_batches([p.tb for p in parts]), cat(lambda p: p.rows), cat(lambda p: p.metas),
                    np.concatenate([p.overlong for p in parts]))


def gather_rollouts(ro: Rollouts) -> Rollouts:
    """Every process's share of a step's rollouts, concatenated in process order (on every process:
    the whole batch, identical everywhere; parallel.distributed)."""
    from dart_jax.parallel.distributed import allgather_objects
    return concat_rollouts(allgather_objects(ro))


# -- scoring ------------------------------------------------------------------------------------------
@dataclasses.dataclass
class Scored:
    scores: np.ndarray     # f32[N] task reward
    valid: np.ndarray      # bool[N] rows whose reference works (a failing gold query drops its prompt)
    accuracy: np.ndarray   # f32[N] EM / execution match, whatever the reward shaping
    counts: dict           # reward outcome counts
    batch: dict            # the train-step arrays (rl/batch.build_batch), advantages included


def score(ro: Rollouts, reward: QAReward | SQLReward, method: MethodSpec, router: RouterSpec,
          pad_multiple: int, norm_adv_by_std: bool = True, answer_tags=None) -> Scored:
    s = reward.score(ro.tb.reward_text, ro.metas, ro.tb.observed)
    acc = task_accuracy("qa" if isinstance(reward, QAReward) else "sql", ro.tb.reward_text, ro.metas, s.scores)
    valid = s.valid & ~ro.overlong  # a prompt the context rule refused carries no loss (rollout)
    batch = batch_lib.build_batch(ro.tb, s.scores, method, router, pad_multiple, norm_adv_by_std, valid,
                                  answer_tags)
    return Scored(s.scores, valid, acc, s.counts, batch)


# -- update -------------------------------------------------------------------------------------------
class Updater:
    """The update stage on a mesh: old / reference log-probs, then ppo_epochs × mini-batches of the
    jitted, sharded train step (one compiled program per padded shape, bounded by pad_multiple).
    The same stage runs SFT (`lc.objective="sft"`: its batch has no log-prob or advantage arrays)."""

    def __init__(self, cfg: ModelConfig, method: MethodSpec, lc: LossConfig, oc: OptimConfig, plan: UpdatePlan,
                 mesh, row_ids: tuple[int, ...] = ()):
        self.cfg, self.method, self.lc, self.plan, self.mesh = cfg, method, lc, plan, mesh
        self.keys = batch_keys(lc)
        self._step = make_train_step(cfg, method, lc, oc, row_ids)
        self._jits: dict = {}
        self._micro = make_micro_step(cfg, method, lc, oc, row_ids) if plan.micro_batch_padding == "own" else None
        self._micro_jits: tuple | None = None
        self._micro_shapes: set = set()  # the micro-batch shapes logged (each compiles its own add)
        scorer = make_scorer(cfg, lc.temperature, lc.logprob_chunk)

        def old_logp(params, base, tokens, positions, routes):
            b, a = model_trees(method, params, base, None)
            return scorer(b, a, tokens, positions, routes)

        # inputs batch-sharded, outputs replicated: every process can read the log-probs back (multi-host)
        rep = NamedSharding(mesh, P())
        self._old = jax.jit(old_logp, out_shardings=rep)
        self._ref = jax.jit(lambda base, tokens, positions: scorer(base, None, tokens, positions, None),
                            out_shardings=rep)

    def logprobs(self, state: TrainState, base, batch: dict) -> tuple[np.ndarray, np.ndarray]:
        """(old, reference) log-probs f32[N, T]. old: recomputed teacher-forced (verl) or, with
        old_logp="sampler", the log-probs the sampler recorded while drawing the tokens — the same
        quantity (log softmax(logits / T) of the unfiltered distribution, tested to ~1e-5) without a
        second forward pass. reference: adapters off / frozen base, only when kl_coef ≠ 0 (else old)."""
        mb, n = self.plan.micro_batch, batch["tokens"].shape[0]
        recompute = self.plan.old_logp == "recompute"
        olds, refs = [], []
        params = state.compute_params()
        for s in range(0, n, mb):
            t, p, r = (jax.device_put(np.asarray(batch[k][s:s + mb]),
                                      batch_sharding(batch[k][s:s + mb].shape, self.mesh))
                       for k in ("tokens", "positions", "route_ids"))
            if recompute:
                olds.append(np.asarray(self._old(params, base, t, p, r)))
            if self.lc.kl_coef != 0:
                refs.append(np.asarray(self._ref(base, t, p)))
        old = np.concatenate(olds) if recompute else batch["sampler_logp"]
        return old, (np.concatenate(refs) if refs else old)

    def _jit_for(self, state: TrainState, base, mb: dict):
        shapes = tuple((k, v.shape) for k, v in mb.items())
        if shapes not in self._jits:
            tokens = dict(shapes).get("tokens")
            log.info("compiling the update for token arrays of %s (micro-batches × rows × tokens; once per "
                     "padded shape)", "×".join(map(str, tokens)) if tokens else shapes)
            self._jits[shapes] = jit_step(self._step, state, base, dict(shapes), self.mesh)
        return self._jits[shapes]

    def __call__(self, state: TrainState, base, batch: dict, rl_step: int, key: jax.Array
                 ) -> tuple[TrainState, list[dict]]:
        """`batch` with old_logp / ref_logp filled -> (state after every mini-batch update, metrics of
        each update). Mini-batch order: a permutation seeded by (seed, rl_step, epoch)."""
        p = self.plan
        n = batch["tokens"].shape[0]
        upd = []
        for epoch in range(p.ppo_epochs):
            rng = np.random.default_rng([p.seed, rl_step, epoch]) if p.shuffle_minibatches else None
            if p.share_prefix and "group" in batch:  # whole groups stay together: their prompt is the prefix
                order = batch_lib.group_order(np.asarray(batch["group"]), rng)
            else:
                order = np.arange(n) if rng is None else rng.permutation(n)
            for k, mb in enumerate(batch_lib.minibatches(batch, order, p.mini_batch, p.micro_batch, self.keys)):
                if self._micro is not None:
                    state, m = self._update_apart(state, base, mb, jax.random.fold_in(key, epoch * 1000 + k), rl_step)
                    upd.append(m)
                    continue
                row_tokens = int(np.sum(mb["positions"] >= 0))
                if p.share_prefix:
                    mb = batch_lib.split_shared_prefix(mb, p.pad_multiple)
                forward_tokens = int(sum(np.sum(mb[k] >= 0) for k in ("positions", "prefix_positions") if k in mb))
                mb = {name: jax.device_put(v, microbatch_sharding(v.shape, self.mesh)) for name, v in mb.items()}
                state, m = self._jit_for(state, base, mb)(state, base, mb, jax.random.fold_in(key, epoch * 1000 + k),
                                                          np.int32(rl_step))
                # the update's forward ran `forward_tokens` tokens for rows holding `row_tokens`
                # (fewer: shared prefixes)
                upd.append(dict(jax.device_get(m), row_tokens=row_tokens, forward_tokens=forward_tokens))
        return state, upd

    def _jits_apart(self, state: TrainState, base):
        """The jitted calls of `train.micro_batch_padding = "own"` (`make_micro_step`): (start, add,
        finish), the gradient carry sharded like the masters and donated to each add, the state to
        finish."""
        if self._micro_jits is None:
            start, add, finish = self._micro
            rep = NamedSharding(self.mesh, P())
            state_sh = jax.tree.map(lambda x: x.sharding, state)
            base_sh = jax.tree.map(lambda x: x.sharding, base)
            params_sh = jax.tree.map(lambda x: x.sharding, state.params)
            sums = jax.eval_shape(start, state, jax.ShapeDtypeStruct((1, 1, 1), jnp.float32))[1][1]
            carry_sh = (params_sh, jax.tree.map(lambda _: rep, sums))
            self._micro_jits = (
                jax.jit(start, in_shardings=(state_sh, rep), out_shardings=(rep, carry_sh)),
                jax.jit(add, in_shardings=(carry_sh, params_sh, base_sh, None, rep, rep, rep),
                        out_shardings=carry_sh, donate_argnums=(0,)),
                jax.jit(finish, in_shardings=(state_sh, carry_sh, rep, rep), out_shardings=(state_sh, rep),
                        donate_argnums=(0,)))
        return self._micro_jits

    def _update_apart(self, state: TrainState, base, mb: dict, key: jax.Array, rl_step: int
                      ) -> tuple[TrainState, dict]:
        """One mini-batch update with each micro-batch padded to its own longest row and run as its own
        call (`train.micro_batch_padding = "own"`): the scan of `make_train_step` unrolled on the host,
        the same gradient sums in the same order."""
        p = self.plan
        start, add, finish = self._jits_apart(state, base)
        scales, carry = start(state, mb["loss_mask"])
        scales = np.asarray(scales)
        params = state.compute_params()  # the masters themselves where no dtype differs (no copy)
        row_tokens = int(np.sum(mb["positions"] >= 0))
        forward_tokens = 0
        for i, one in enumerate(batch_lib.micro_batches_apart(mb, p.pad_multiple, p.share_prefix)):
            forward_tokens += int(sum(np.sum(one[k] >= 0) for k in ("positions", "prefix_positions") if k in one))
            shapes = tuple((k, v.shape) for k, v in one.items())
            if shapes not in self._micro_shapes:
                self._micro_shapes.add(shapes)
                log.info("compiling the update for a micro-batch of %s%s (rows × tokens; once per padded shape)",
                         f"a {one['prefix_tokens'].shape[2]}-token prompt + " if "prefix_tokens" in one else "",
                         "×".join(map(str, one["tokens"].shape[1:])))
            one = {name: jax.device_put(v, microbatch_sharding(v.shape, self.mesh)) for name, v in one.items()}
            carry = add(carry, params, base, one, np.float32(scales[i]), key, np.int32(i))
        del params  # a cast copy (bf16 full fine-tuning: the whole model) freed before the optimiser's update
        state, m = finish(state, carry, np.float32(np.sum(mb["loss_mask"])), np.int32(rl_step))
        return state, dict(jax.device_get(m), row_tokens=row_tokens, forward_tokens=forward_tokens)


# -- the step's metrics -------------------------------------------------------------------------------
UPDATE_KEYS = ("loss", "pg_loss", "kl", "entropy", "pg_clipfrac", "pg_clipfrac_lower", "ppo_kl", "grad_norm")


def step_metrics(ro: Rollouts, sc: Scored, upd: list[dict], task: str, with_kl: bool, gap: bool,
                 times: dict[str, float]) -> dict:
    """One metrics row: rewards (over rows that count), accuracy per source, protocol-following,
    tool use, token counts per role, update statistics (mean over updates), timings."""
    tb, batch, ok, scores = ro.tb, sc.batch, sc.valid, sc.scores
    mean: Callable[[np.ndarray], float] = lambda x: float(x.mean()) if x.size else float("nan")  # noqa: E731
    m: dict[str, Any] = {"reward/mean": mean(scores[ok]),
                         "reward/std": float(scores[ok].std()) if ok.any() else float("nan"),
                         "reward/min": float(scores[ok].min()) if ok.any() else float("nan"),
                         "reward/max": float(scores[ok].max()) if ok.any() else float("nan"),
                         "accuracy/mean": mean(sc.accuracy[ok]),
                         "reward/dropped_prompts": float(len({tb.uids[i] for i in np.flatnonzero(~ok)}))}
    # GRPO learns only from groups whose scores differ: an all-equal group of two or more samples has
    # all-zero advantages
    groups: dict[str, set] = {}
    for i in np.flatnonzero(ok):
        groups.setdefault(tb.uids[i], set()).add(float(scores[i]))
    m["advantage/groups"] = float(len(groups))
    m["advantage/mixed_groups"] = float(sum(len(v) > 1 for v in groups.values()))
    for k, v in sc.counts.items():
        m[f"reward/{task}_{k}"] = float(v)
    for src in sorted({x["data_source"] for x in ro.metas}):
        idx = np.asarray([i for i, x in enumerate(ro.metas) if x["data_source"] == src and ok[i]], int)
        m[f"reward/{src}"] = mean(scores[idx])
        m[f"accuracy/{src}"] = mean(sc.accuracy[idx])
    # prompts the context rule refused (rollout.tasks.overlong) ran nothing: the rates are over the rows that ran
    ran = ~np.asarray(ro.overlong, bool)
    m["rollout/prompts_overlong"] = float(len({tb.uids[i] for i in np.flatnonzero(~ran)}))
    finish = np.asarray(tb.finish_reason)[ran]
    m["protocol/answer_rate"] = mean(finish == "answer")
    for reason in ("invalid", "length", "budget"):
        m[f"protocol/finish_{reason}"] = mean(finish == reason)
    m["rollout/tool_calls"] = mean(tb.tool_calls()[ran])
    m["rollout/turns"] = mean(np.asarray([len(t) for t in tb.turns])[ran])
    m["rollout/response_tokens"] = mean((tb.length - tb.prompt_len)[ran])
    m["rollout/sampled_tokens"] = mean(tb.loss_mask.sum(-1)[ran])
    mask = batch["loss_mask"]
    m["tokens/reasoning"] = float(np.sum(mask * (batch["loss_roles"] == REASONING)))
    m["tokens/tool"] = float(np.sum(mask * (batch["loss_roles"] == TOOL)))
    if gap:  # old log-probs recomputed: how far the sampler's are from them
        sampled = np.pad(tb.loss_mask, ((0, 0), (0, mask.shape[1] - tb.loss_mask.shape[1]))) > 0
        diff = np.abs(batch["sampler_logp"] - batch["old_logp"])[sampled]
        m["rollout/logprob_gap_mean"] = float(diff.mean()) if diff.size else 0.0
        m["rollout/logprob_gap_max"] = float(diff.max()) if diff.size else 0.0
    m["advantage/abs_mean"] = float(np.abs(batch["advantages"]).mean())
    keys = UPDATE_KEYS if with_kl else tuple(k for k in UPDATE_KEYS if k != "kl")  # no reference, no KL
    if upd and "router_aux" in upd[0]:  # MixLoRA's load-balancing term (already inside actor/loss)
        keys += ("router_aux",)
    for k in keys:
        vals = [float(u[k]) for u in upd if math.isfinite(float(u[k]))]
        m[f"actor/{k}"] = float(np.mean(vals)) if vals else float("nan")
    m["actor/skipped_updates"] = float(sum(float(u["skipped"]) for u in upd))
    m["actor/lr"] = float(upd[-1]["lr"]) if upd else float("nan")  # every update of one RL step shares it
    if upd and "row_tokens" in upd[0]:  # tokens the updates' forwards ran vs tokens in their rows (train.share_prefix)
        m["actor/row_tokens"] = float(sum(u["row_tokens"] for u in upd))
        m["actor/forward_tokens"] = float(sum(u["forward_tokens"] for u in upd))
    total = sum(times.values())
    for name, t in times.items():
        m[f"time/{name}_s"] = t
    m["time/step_s"] = total
    m["throughput/tokens_per_s"] = float(np.sum(batch["positions"] >= 0)) / max(total, 1e-9)
    m["rollout/generated_tokens_per_s"] = float(tb.loss_mask.sum()) / max(times.get("rollout", 0.0), 1e-9)
    return m
