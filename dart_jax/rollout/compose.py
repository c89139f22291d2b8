"""Two policies, one trajectory: CEA's compositions (H_Tool, H_Reas) and the 2-Agent baseline.

Semantics (the paper's two-model composition): the *reasoning* policy writes every token outside a
tool span, including the token that opens one; the *tool* policy writes the span's content through
its closing tag; the tool's observation follows; control returns to the reasoning policy. Which
policy writes token t is the router's state after token t − 1 (`RouterSpec`: inside a span → the
tool policy), so the writer of every token is a function of the ids alone (`writers`). In the
answer-only segment after the tool budget, a span's closing tag hands control back without a call.

Each policy keeps its own KV cache and sees every token of the shared history exactly once: a
hand-off appends to the incoming policy's cache only the tokens it has not seen (the other
policy's tokens and the observations since it last wrote) and draws its first token from the end
of that append — nothing is re-encoded. The caches are synchronised lazily, so a policy that never
gets control again never pays for the tail of the trajectory.

Sampling keys are (seed, row, position) (rollout.sampler), so two identical policies give exactly
the single-policy trajectory for the same seed (tested), and each sampled token's log-prob is the
writer's. The trajectory's `route_ids` are the router's roles over the final ids (what a DART
policy would have recorded), whatever the policies' own route modes.

The cheaper `routed` alternative (`routed_adapters`): one forward over one shared base with a
per-token choice between two LoRA sets — the DART layout, valid only when both policies are LoRA
adapters over the *same* frozen base (a full-parameter M_Tool or M_Reas cannot be expressed). It is
a different model of the composition, not an approximation of it: with one cache, the keys and
values of a reasoning token are computed by the reasoning adapter for both roles' later tokens,
while in the two-model mode each policy reads the whole history through its own weights.
"""

from __future__ import annotations

import dataclasses
import time
from typing import Any, Mapping

import jax
import jax.numpy as jnp
import numpy as np

from dart_jax.adapters.method import TwoModels, two_model_route_mode
from dart_jax.models.config import ModelConfig
from dart_jax.roles.router import REASONING, TOOL, route_roles
from dart_jax.rollout.agent import Agent, Decoder, SinglePolicy
from dart_jax.rollout.gather import run_append, run_segment
from dart_jax.rollout.placement import decode_params, new_cache
from dart_jax.rollout.sampler import (
    LENGTH,
    RUNNING,
    STOPPED,
    SamplerSpec,
    Segment,
    bucket,
    cache_bucket,
    cache_used,
    ensure_capacity,
    prefill,
)
from dart_jax.rollout.trajectory import TrajectoryBatch

ROLES = ("reasoning", "tool")


@dataclasses.dataclass(frozen=True)
class Policy:
    """One model of a composition: its base weights, optional adapters and how they are routed
    ("role": DART's two adapters by role; "shared": one LoRA on every token; "none": no adapter)."""
    cfg: ModelConfig
    base: Any
    adapters: Mapping | None = None
    route_mode: str = "none"

    def __post_init__(self):
        if self.adapters is None and self.route_mode != "none":
            raise ValueError(f"Policy route_mode={self.route_mode!r} without adapters; use 'none'")
        if self.adapters is not None and self.route_mode == "none":
            raise ValueError("Policy has adapters but route_mode='none': say how they are routed ('role' or 'shared')")


def compose_rollout(agent: Agent, reasoning: Policy, tool: Policy, prompts: list[list[int]], uids: list,
                    meta: list[dict] | None = None, seed: int = 0, row_offset: int = 0) -> TrajectoryBatch:
    """A rollout in which `reasoning` writes outside tool spans and `tool` inside them (see module doc).
    `agent` supplies the tokenizer, protocol, tool, sampling and rollout budgets; the policies must
    share its tokenizer. `row_offset`: as Agent.rollout's."""
    return agent.run(TwoPolicies(agent, reasoning, tool, prompts, seed, row_offset), prompts, uids, meta)


def policy_decoder(agent: Agent, base, adapters, prompts: list[list[int]], seed: int = 0,
                   row_offset: int = 0) -> Decoder:
    """The decoder of a policy's trees: `SinglePolicy`, or for the 2-Agent policy (`base` a TwoModels,
    adapters.method) the two-model composition: its reasoning model writes outside the tool spans,
    its tool model inside them."""
    if isinstance(base, TwoModels):
        cfg = agent.spec.model
        reas, tool = (Policy(cfg, b, a, two_model_route_mode(a)) for b, a in base.models())
        return TwoPolicies(agent, reas, tool, prompts, seed, row_offset)
    return SinglePolicy(agent, base, adapters, prompts, seed, row_offset)


def rollout_policy(agent: Agent, base, adapters, prompts: list[list[int]], uids: list, meta: list[dict] | None = None,
                   seed: int = 0, row_offset: int = 0) -> TrajectoryBatch:
    """A rollout of one policy, or of the 2-Agent policy through the two-model composition
    (`policy_decoder`). `row_offset`: as Agent.rollout's. (On the serving engine instead:
    serve.rollouts.engine_batch, the same draws per row.)"""
    return agent.run(policy_decoder(agent, base, adapters, prompts, seed, row_offset), prompts, uids, meta)


class TwoPolicies:
    """The agent loop's decoder (`agent.Decoder`) for a two-policy composition (`Agent.run`)."""

    # a segment is a decode call per hand-off, an append each hand-off: it books its own decode steps and
    # appends in Agent.time (its `observe` only replays the router on the host)
    own_account = True

    def __init__(self, agent: Agent, reasoning: Policy, tool: Policy, prompts: list[list[int]], seed: int,
                 row_offset: int = 0):
        self.agent = agent
        stops = agent.spec.stops + ((agent.open_id,),)
        self.handoff = len(stops) - 1  # the opening tag ends the reasoning policy's segment
        self.n_stops = len(agent.spec.stops)
        self.tool_stops = list(agent.stop_groups["tool"])
        self.pols = (reasoning, tool)
        self.specs = tuple(SamplerSpec(p.cfg, agent.spec.router, agent.spec.sampling, stops, p.route_mode,
                                       agent.spec.placement) for p in self.pols)
        self.bases = tuple(decode_params(p.base, agent.rc.decode_layout) for p in self.pols)
        tokens, positions, rows, self.t_prompt = agent.prompt_batch(prompts)
        self.seg_bucket = bucket(agent.rc.max_tokens_per_turn)
        b = len(prompts)
        key = jax.random.PRNGKey(seed)
        self.states = []
        for base, pol, spec in zip(self.bases, self.pols, self.specs):
            cache = new_cache(spec.model, tokens.shape[0], cache_bucket(self.t_prompt + self.seg_bucket),
                              spec.placement)
            # every prompt's last token stays pending: a policy's first draw comes from its first sync
            st, _ = prefill(base, pol.adapters, tokens, positions, cache, key, rows, row_offset, spec=spec,
                            hold_last=True, sampling=agent.row_sampling(b))
            self.states.append(st)
        # have[w][i]: response tokens policy w holds for row i, its pending token included (its cache
        # holds everything before that token); a sync appends the rest and draws w's next token
        self.have = np.zeros((2, b), np.int64)
        self.inside = np.array(jax.device_get(self.states[0].router), bool)  # router state after the prompt
        self.appends = np.zeros(2, np.int64)  # hand-off appends per policy (for benches and tests)
        self.events = {"span_opened": 0, "span_closed_no_call": 0, "turn_started_inside": 0}
        # consumed[w][i]: trajectory tokens policy w has run its forward over for row i; each token at
        # most once (the last pending one never): ≤ the trajectory's length − 1
        self.consumed = np.asarray([[len(p) - 1 for p in prompts]] * 2, np.int64)

    # -- synchronisation --------------------------------------------------------------------------
    def _sync(self, w: int, rows: np.ndarray, stream: list[list[int]]) -> None:
        """Append to policy w's cache, for `rows`, the trajectory tokens after its pending one (the other
        policy's tokens and observations since w last wrote; none at its very first draw) and draw its
        next token. Every call is followed by a decode of the same rows, which records that draw."""
        b = len(rows)
        delta = {int(i): stream[i][self.have[w, i]:] for i in np.nonzero(rows)[0]}
        width = bucket(max(1, max(len(d) for d in delta.values())))
        obs = np.zeros((b, width), np.int32)
        obs_len = np.zeros(b, np.int32)
        for i, d in delta.items():
            obs[i, :len(d)], obs_len[i] = d, len(d)
        st = ensure_capacity(self.states[w], cache_used(self.states[w]) + width + 1 + self.seg_bucket,
                             self.specs[w].placement)
        t = time.perf_counter()
        self.states[w], _ = run_append(self.bases[w], self.pols[w].adapters, st, obs, obs_len, rows, spec=self.specs[w],
                                       gather_rows=self.agent.rc.gather_rows)
        jax.block_until_ready(self.states[w])  # its time is the append's, not the next decode's (Agent.time)
        self.agent.time["append_s"] += time.perf_counter() - t
        self.agent.time["appends"] += 1
        for i, d in delta.items():
            self.consumed[w, i] += 1 + len(d)
        self.appends[w] += 1

    # -- the decoder interface ------------------------------------------------------------------
    def segment(self, active: np.ndarray, enabled: np.ndarray, budget: np.ndarray, resp: list[dict]) -> Segment:
        b = len(active)
        n = self.seg_bucket
        out = Segment(tokens=np.full((b, n), -1, np.int32), logprobs=np.zeros((b, n), np.float32),
                      routes=np.full((b, n), -1, np.int32), count=np.zeros(b, np.int32),
                      finish=np.full(b, RUNNING, np.int32), stop_index=np.full(b, -1, np.int32))
        left = np.where(active, budget, 0).astype(np.int32)
        todo = active.copy()
        self.events["turn_started_inside"] += int((active & self.inside).sum())
        while todo.any():
            for w in (0, 1):
                rows = todo & (self.inside == bool(w))
                if not rows.any():
                    continue
                stream = [r["ids"] + out.tokens[i, :out.count[i]].tolist() for i, r in enumerate(resp)]
                self._sync(w, rows, stream)
                en = np.zeros((b, self.n_stops + 1), bool)
                en[:, :self.n_stops] = enabled
                if w == 0:
                    en[:, self.handoff] = True
                else:
                    en[:, self.tool_stops] = True  # the closing tag always ends the tool policy's turn
                st = ensure_capacity(self.states[w], cache_used(self.states[w]) + n, self.specs[w].placement)
                self.states[w], seg = run_segment(self.bases[w], self.pols[w].adapters, st, rows, en,
                                                  np.maximum(left, 1), spec=self.specs[w], length=n,
                                                  gather_rows=self.agent.rc.gather_rows)
                steps = int(seg.count[rows].max())  # this call's longest row: a segment is several calls here
                self.agent.time["decode_steps"] += steps
                self.agent.time["row_steps"] += steps * int(rows.sum())
                router = jax.device_get(self.states[w].router)
                for i in np.nonzero(rows)[0]:
                    k, c = int(seg.count[i]), int(out.count[i])
                    out.tokens[i, c:c + k] = seg.tokens[i, :k]
                    out.logprobs[i, c:c + k] = seg.logprobs[i, :k]
                    out.count[i] = c + k
                    left[i] -= k
                    self.consumed[w, i] += k - 1
                    self.have[w, i] = len(resp[i]["ids"]) + c + k
                    self.inside[i] = bool(router[i])
                    stop = int(seg.stop_index[i])
                    stopped = seg.finish[i] == STOPPED
                    if stopped and w == 0 and stop == self.handoff:
                        handoff = True          # the reasoning policy opened a span
                        self.events["span_opened"] += 1
                    elif stopped and w == 1 and stop in self.tool_stops and not enabled[i, stop]:
                        handoff = True          # a span closed where no tool call is allowed (final segment)
                        self.events["span_closed_no_call"] += 1
                    else:
                        handoff = False
                    if handoff and left[i] > 0:
                        continue
                    out.finish[i] = LENGTH if handoff else seg.finish[i]
                    out.stop_index[i] = -1 if handoff else stop
                    todo[i] = False
        return out

    def observe(self, obs: np.ndarray, obs_len: np.ndarray, do: np.ndarray, resp: list[dict]) -> np.ndarray:
        """Observations join the trajectory only; each policy encodes them when it next gets control."""
        for i in np.nonzero(do)[0]:
            self.inside[i] = _router_after(self.inside[i], obs[i, :obs_len[i]], self.agent.spec.router)
        return np.full(obs.shape, -1, np.int32)

    def final_routes(self, prompts: list[list[int]], resp: list[dict]):
        """The router's roles over the final ids: prompt routes and each response token's route."""
        routes = []
        for p, r in zip(prompts, resp):
            ids = jnp.asarray([list(p) + r["ids"]], jnp.int32)
            routes.append(np.asarray(route_roles(ids, self.agent.spec.router))[0].tolist())
        p_routes = [rt[:len(p)] for rt, p in zip(routes, prompts)]
        resp = [dict(r, routes=rt[len(p):]) for r, rt, p in zip(resp, routes, prompts)]
        return p_routes, resp


def _router_after(state: bool, ids: np.ndarray, router) -> bool:
    """Host replay of the router's state over `ids` (an observation may hold tag ids)."""
    for t in ids.tolist():
        if t in router.open_ids:
            state = True
        elif t in router.close_ids:
            state = False
    return state


def writers(ids: np.ndarray, prompt_len: int, router) -> np.ndarray:
    """i32[L]: which policy wrote each token of one trajectory under the composition (0 reasoning,
    1 tool, −1 prompt); observation positions get the role of the policy in control and are not
    written by either (the caller masks them with the loss mask)."""
    # the token at t is drawn by the policy in control after t − 1: inside a span (router state
    # after t − 1: ψ's route of position t − 1 under the "dart_jax" convention) the tool policy, else
    # the reasoning policy
    after = dataclasses.replace(router, convention="dart_jax")
    inside_after = np.asarray(route_roles(jnp.asarray(ids, jnp.int32)[None], after))[0] == TOOL
    out = np.where(np.concatenate([[False], inside_after[:-1]]), 1, 0).astype(np.int32)
    out[:prompt_len] = -1
    return out


def routed_adapters(reasoning, tool, template: Mapping) -> dict:
    """The `routed` mode: one DART adapter tree whose reasoning / tool adapters are two single-LoRA
    variants over one base (a `LoraAdapter` each, e.g. the "shared" adapter of a LoRA run; None: that
    role runs the bare base, a zero adapter). `template`: a DART tree of the same shapes
    (dart_jax.adapters.method.init_adapters with variant "dart") that supplies the zeros."""
    out = {}
    for name, src in (("reasoning", reasoning), ("tool", tool)):
        if name not in template:
            raise ValueError(f"template adapters have no {name!r} adapter (need a DART tree); have {sorted(template)}")
        tpl = template[name]
        if src is None:
            out[name] = tpl.replace(params=jax.tree_util.tree_map(jnp.zeros_like, tpl.params))
            continue
        shapes = lambda a: jax.tree_util.tree_map(lambda x: tuple(x.shape), a.params)  # noqa: E731
        if shapes(src) != shapes(tpl):
            raise ValueError(f"the {name} adapter's shapes differ from the template's (rank / targets / model): "
                             f"{shapes(src)} vs {shapes(tpl)}")
        out[name] = src
    return out


__all__ = ["Policy", "TwoPolicies", "compose_rollout", "policy_decoder", "rollout_policy", "routed_adapters", "writers",
           "REASONING", "TOOL", "ROLES"]
