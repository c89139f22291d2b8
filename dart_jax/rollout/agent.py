"""The agent loop (host side): decode until a tool call, an answer or a limit; run the tool for all
paused rows in one batch; append the observation ids into the existing KV cache; resume.

Nothing is re-tokenised: the tool call is parsed from the segment's own ids (only the span between
the tags is decoded), observations are tokenised alone and appended, and the trajectory is the
exact id stream the model saw.
"""

from __future__ import annotations

import collections
import dataclasses
import time
import typing
from typing import Any, Callable

import jax
import jax.numpy as jnp
import numpy as np

from dart_jax.data.text import valid_text
from dart_jax.models.generate import left_pad
from dart_jax.roles.router import RouterSpec
from dart_jax.rollout.gather import run_append, run_segment
from dart_jax.rollout.placement import DECODE_LAYOUTS, RolloutMesh, decode_params, new_cache
from dart_jax.rollout.protocol import PROMPT_TAGS, Protocol, stop_sequences
from dart_jax.rollout.sampler import (
    STOPPED,
    SamplerSpec,
    Segment,
    bucket,
    cache_bucket,
    cache_used,
    ensure_capacity,
    prefill,
)
from dart_jax.rollout.sampling import RowSampling, SamplingConfig
from dart_jax.rollout.trajectory import TrajectoryBatch, assemble, reward_views
from dart_jax.rollout.turn import SegmentEnd, TurnDecision, decide_turn, observation_fits
from dart_jax.tokenization.sentinels import sentinel_ids
from dart_jax.tokenization.tokenizer import encode_text

INVALID_POLICIES = ("search_r1", "none")
# rollout settings that place, split or share arrays, not what the trajectories are
LAYOUT_ONLY = ("decode_layout", "chunk_rows", "share_prompt_prefill", "engine", "train_engine", "engine_segment",
               "gather_rows", "obs_multiple")
# how rollouts are decoded: "batch" (Agent.run: a batch's turns in lockstep, each turn waiting for its
# longest row) or "continuous" (serve.engine: rows refilled as they finish, tool calls off the decode
# step, finished and paused rows cost nothing; each row draws as it would in its batch)
ENGINES = ("batch", "continuous")


def trajectory_settings(rollout: dict) -> dict:
    """A rollout config section without `LAYOUT_ONLY` keys: what resume fingerprints compare."""
    return {k: v for k, v in dict(rollout).items() if k not in LAYOUT_ONLY}
MIN_OBS_TOKENS = 8


@dataclasses.dataclass(frozen=True)
class RolloutConfig:
    max_turns: int = 4                 # action budget B
    max_tokens_per_turn: int = 500
    max_response_tokens: int = 4096    # generated + observation tokens
    max_obs_tokens: int = 1024         # observation cap, closing tag kept
    invalid_action: str = "none"       # "none" (DART: end the row) or a corrective message ("search_r1")
    final_answer_segment: bool = True  # after the budget, one segment with the tool stop disabled
    route_mode: str = "role"
    prompt_tags: str = "atomic"        # the prompt's instruction tags: sentinel ids or text (rollout.tasks)
    share_prompt_prefill: bool = True  # identical prompts (a GRPO group) are prefilled once
    decode_layout: str = "per_layer"   # per_layer: a sharded per-layer weight copy; stacked: none (rollout.placement)
    # trajectories decoded at once (whole GRPO groups, rl.stages.rollout): the KV cache holds this many
    # rows instead of the step's whole share; 0 = the share in one batch. Same draws either way.
    chunk_rows: int = 0
    engine: str = "batch"              # ENGINES: evaluation's rollouts (launch.evaluate, the trainer's held-out checks)
    train_engine: str = "batch"        # ENGINES: GRPO's rollouts (a step's batch)
    engine_segment: int = 32           # continuous: tokens per decode segment (the refill granularity)
    # batch: a batch of at least this many rows decodes / appends only its running rows, gathered into a
    # bucket of 1, 2, 4, … rows, whenever that bucket is smaller than the batch (rollout.gather; one
    # device; on XLA:CPU where vm.max_map_count holds the extra programs); 0 = never
    gather_rows: int = 8
    # columns of a batch's observation append (the batch loop): 0 = the power-of-two bucket of its longest
    # observation (`bucket`: few compiled widths); k > 0 = that length rounded up to a multiple of k (more
    # widths to compile, less padding to run: an append is a prefill, compute-bound). Capped at
    # max_obs_tokens rounded up to 16 either way. The same tokens (padding is masked) up to rounding
    obs_multiple: int = 0

    def __post_init__(self):
        if self.invalid_action not in INVALID_POLICIES:
            raise ValueError(f"invalid_action={self.invalid_action!r}; expected one of {INVALID_POLICIES}")
        if self.prompt_tags not in PROMPT_TAGS:
            raise ValueError(f"rollout.prompt_tags={self.prompt_tags!r}; expected one of {PROMPT_TAGS}")
        if self.decode_layout not in DECODE_LAYOUTS:
            raise ValueError(f"rollout.decode_layout={self.decode_layout!r}; expected one of {DECODE_LAYOUTS}")
        if self.max_obs_tokens < MIN_OBS_TOKENS:
            raise ValueError(f"rollout.max_obs_tokens={self.max_obs_tokens}: an observation needs at least "
                             f"{MIN_OBS_TOKENS} tokens (its closing tag and newlines alone take several)")
        for name in ("engine", "train_engine"):
            if getattr(self, name) not in ENGINES:
                raise ValueError(f"rollout.{name}={getattr(self, name)!r}; expected one of {ENGINES}")
        if self.engine_segment < 1:
            raise ValueError(f"rollout.engine_segment={self.engine_segment} must be ≥ 1")
        if self.gather_rows < 0:
            raise ValueError(f"rollout.gather_rows={self.gather_rows} must be ≥ 0 (0: never gather)")
        if self.obs_multiple < 0 or 0 < self.obs_multiple < 8:
            # each width is a compiled append program per row bucket and cache size (XLA:CPU's memory maps)
            raise ValueError(f"rollout.obs_multiple={self.obs_multiple}: 0 (power-of-two widths) or ≥ 8")
        if self.chunk_rows < 0:
            raise ValueError(f"rollout.chunk_rows={self.chunk_rows} must be ≥ 0 (0: the step's share in one batch)")
        for name in ("max_turns", "max_tokens_per_turn", "max_response_tokens"):
            if getattr(self, name) < 1:
                raise ValueError(f"rollout.{name}={getattr(self, name)} must be ≥ 1")


ToolFn = Callable[[list[str], list[dict]], list[str]]


class Decoder(typing.Protocol):
    """The device side of one rollout batch, driven turn by turn by `Agent.run`: `SinglePolicy` (one
    model writes every token) or `rollout.compose.TwoPolicies` (two models, one trajectory)."""

    def segment(self, active: np.ndarray, enabled: np.ndarray, budget: np.ndarray, resp: list[dict]) -> Segment:
        """Decode one turn of the `active` rows: up to budget[b] tokens each, ending at a stop sequence
        switched on in enabled[b] (bool[B, len(spec.stops)]); `resp`: each row's response so far."""
        ...

    def observe(self, obs: np.ndarray, obs_len: np.ndarray, do: np.ndarray, resp: list[dict]) -> np.ndarray:
        """Append observation ids obs[b, :obs_len[b]] to the rows where `do`. -> their routes i32[B, To]."""
        ...

    def final_routes(self, prompts: list[list[int]], resp: list[dict]) -> tuple[list[list[int]], list[dict]]:
        """-> (each prompt's routes, the responses with their final routes) of the finished batch."""
        ...


class Agent:
    """Binds a model, tokenizer, protocol and tool; `rollout(prompts)` returns a TrajectoryBatch.
    `mesh`: the run's device mesh; the decode state (KV cache, per-row vectors) is sharded on it
    (rollout.placement) and the weights are used where the run placed them."""

    def __init__(self, cfg, tokenizer, protocol: Protocol, tool: ToolFn, sampling: SamplingConfig,
                 rollout: RolloutConfig = RolloutConfig(), router_convention: str = "dart_jax", mesh=None):
        self.tok, self.protocol, self.tool, self.rc = tokenizer, protocol, tool, rollout
        ids = sentinel_ids(tokenizer, (protocol.tool_open, protocol.tool_close))
        self.open_id, self.close_id = ids[protocol.tool_open], ids[protocol.tool_close]
        stops, self.stop_groups = stop_sequences(tokenizer, protocol, cfg.eos_token_ids)
        router = RouterSpec((self.open_id,), (self.close_id,), router_convention)
        # temperature and top-p travel as data in the decode state (`row_sampling`), not in the compiled
        # programs: a greedy held-out check and a sampled training rollout of the same batch size run the
        # same programs (top-k, a shape, stays static). A row draws what `sample` with its settings gives
        self.sampling = sampling
        self.spec = SamplerSpec(cfg, router, SamplingConfig(top_k=sampling.top_k), stops, rollout.route_mode,
                                RolloutMesh.of(mesh))
        self.obs_close_ids = tokenizer.encode(protocol.obs_close, add_special_tokens=False)
        # where `run`'s time goes, summed over its calls until the caller takes it (`take_phases`):
        # seconds in the decode segments, the tool and the observation appends (host wall clock; each waits
        # for its device work, so the prefill dispatched before `run` is in the first segment's), decode
        # segments, decode steps (per decode call, its longest row's tokens; the first token of a call is
        # drawn from logits already computed) and row-steps (rows in a call × its steps) against the tokens
        # kept. The serving engine adds its own phase seconds (serve.rollouts), not steps
        self.time: collections.Counter = collections.Counter()

    def take_phases(self) -> dict:
        """Where the rollouts since the last call spent their time (`self.time`, then cleared): seconds in
        decode segments, tool calls, observation appends (and the engine's admissions), decode segments
        and steps, appends, and the decode's fill (tokens kept / row-steps run: below 1 where a segment's
        rows wait for its longest one)."""
        t, out = dict(self.time), {}
        self.time.clear()
        for k in ("decode_s", "tool_s", "append_s", "admit_s", "segments", "decode_steps", "appends"):
            if k in t:
                out[k] = float(t[k])
        if t.get("row_steps"):
            out["decode_fill"] = float(t["kept_tokens"]) / float(t["row_steps"])
        return out

    def row_sampling(self, b: int) -> RowSampling:
        """The agent's temperature and top-p for each of b rows (what `prefill` puts in the decode state)."""
        return RowSampling.of(np.full(b, self.sampling.temperature), np.full(b, self.sampling.top_p))

    # -- host helpers -------------------------------------------------------------------------
    def _query(self, seg_ids: list[int]) -> str | None:
        """The tool call of a segment that ended with the closing tag: the ids after the last
        opening tag, decoded alone. None when the segment has no opening tag."""
        if self.open_id not in seg_ids:
            return None
        start = len(seg_ids) - 1 - seg_ids[::-1].index(self.open_id)
        return self.tok.decode(seg_ids[start + 1:-1], skip_special_tokens=True).strip()

    def obs_ids(self, text: str) -> list[int]:
        return observation_ids(self.tok, self.protocol, text, self.rc.max_obs_tokens)

    def _has_answer(self, text: str) -> bool:
        return self.protocol.answer_open in text and self.protocol.answer_close in text

    def _stop_group(self, finish: int, stop_index: int) -> str | None:
        """The stop group ("tool", "answer", "eos") whose sequence ended a segment; None: its budget."""
        if finish != STOPPED:
            return None
        return next((g for g, idx in self.stop_groups.items() if stop_index in idx), None)

    def end_turn(self, ids: list[int], finish: int, stop_index: int, response_tokens: int, calls: int,
                 limit: int) -> tuple[SegmentEnd, TurnDecision]:
        """One row's turn that wrote `ids` and ended as (finish, stop_index) (a Segment's codes), the row's
        response then `response_tokens` long after `calls` tool calls, within `limit` response tokens
        -> (what it ended with, the decision: rollout.turn.decide_turn)."""
        stop = self._stop_group(finish, stop_index)
        end = SegmentEnd(stop, self._query(ids) if stop == "tool" else None,
                         self._has_answer(self.tok.decode(ids, skip_special_tokens=True)), response_tokens, calls)
        return end, decide_turn(end, self.rc.max_turns, limit, self.rc.invalid_action)

    def observation(self, body: str, calls: int) -> tuple[str, str, int]:
        """A tool result for a row after `calls` calls -> (the observation text to append, the body made
        valid text, how many invalid characters were replaced): a passage or SQL cell may hold lone
        surrogates, made valid (U+FFFD) before it is rendered, stored or tokenised."""
        body, replaced = valid_text(body)
        return self.protocol.render_observation(body, self.rc.max_turns - calls), body, replaced

    def turn_limit(self) -> int:
        """Turns a row may take: the tool budget, one more, and the answer-only segment if on."""
        return self.rc.max_turns + (2 if self.rc.final_answer_segment else 1)

    def response_limit(self, prompt_len: int) -> int:
        """A row's response budget: max_response_tokens, cut at the model's context (then "length")."""
        return min(self.rc.max_response_tokens, self.spec.model.max_position_embeddings - prompt_len)

    # -- the loop -----------------------------------------------------------------------------
    def rollout(self, base, adapters, prompts: list[list[int]], uids: list, meta: list[dict] | None = None,
                seed: int = 0, row_offset: int = 0) -> TrajectoryBatch:
        """`row_offset`: these prompts are rows [row_offset, row_offset + B) of a larger batch (a
        process's share): sampling draws as the whole batch would (sampler.initial_keys)."""
        return self.run(SinglePolicy(self, base, adapters, prompts, seed, row_offset), prompts, uids, meta)

    def prompt_batch(self, prompts: list[list[int]]) -> tuple[jnp.ndarray, jnp.ndarray, jnp.ndarray | None, int]:
        """-> (left-padded distinct prompts, positions, rows or None, width): each distinct prompt is
        prefilled once and a group's samples continue from its cache rows. Width: power-of-two
        buckets to 512, then multiples of 256 (a 1,100-token schema prompt prefills 1,280 positions)."""
        pad = self.tok.pad_token_id if self.tok.pad_token_id is not None else 0
        t_prompt = cache_bucket(max(len(p) for p in prompts))
        first: dict[tuple, int] = {}
        rows = [first.setdefault(tuple(p), len(first)) for p in prompts]
        shared = self.rc.share_prompt_prefill and len(first) < len(prompts)
        unique = [list(p) for p in first] if shared else prompts
        tokens, positions = left_pad(unique, pad)
        extra = t_prompt - tokens.shape[1]
        tokens = jnp.pad(tokens, ((0, 0), (extra, 0)), constant_values=pad)
        positions = jnp.pad(positions, ((0, 0), (extra, 0)), constant_values=-1)
        return tokens, positions, (jnp.asarray(rows, jnp.int32) if shared else None), t_prompt

    def run(self, decoder: Decoder, prompts: list[list[int]], uids: list,
            meta: list[dict] | None = None) -> TrajectoryBatch:
        """The host loop over turns: `decoder` decodes each turn of the active rows; each row's segment
        end is decided by `rollout.turn.decide_turn`; the tool runs on all calls of the turn in one batch
        and the observations are appended through the decoder."""
        rc = self.rc
        b = len(prompts)
        meta = meta or [{} for _ in range(b)]
        resp = [{"ids": [], "mask": [], "logprobs": [], "routes": []} for _ in range(b)]
        turns: list[list[dict]] = [[] for _ in range(b)]
        spans: list[list[tuple[int, int, bool]]] = [[] for _ in range(b)]  # observations: (start, length, tool)
        finish: list[str | None] = [None] * b
        calls = np.zeros(b, np.int32)
        n_stops = len(self.spec.stops)
        # each row's response budget ends at the model's context (then "length"): rollout.tasks.overlong
        limit = [self.response_limit(len(p)) for p in prompts]
        seg_bucket = bucket(rc.max_tokens_per_turn)
        for turn in range(self.turn_limit()):
            active = np.asarray([f is None for f in finish])
            if not active.any():
                break
            final = calls >= rc.max_turns
            enabled = np.ones((b, n_stops), bool)
            enabled[np.ix_(final, self.stop_groups["tool"])] = False
            room = np.asarray([limit[i] - len(r["ids"]) for i, r in enumerate(resp)])
            budget = np.clip(np.minimum(room, rc.max_tokens_per_turn), 1, seg_bucket)
            t, appended = time.perf_counter(), self.time["append_s"]
            seg = decoder.segment(active, enabled, budget.astype(np.int32), resp)
            # a decoder that appends inside its segment (a two-model hand-off) books that time as append_s
            self.time["decode_s"] += time.perf_counter() - t - (self.time["append_s"] - appended)
            kept = seg.count[active]
            self.time["segments"] += 1
            self.time["kept_tokens"] += int(kept.sum())
            if not getattr(decoder, "own_account", False):  # one decode call: it runs to its longest row's tokens
                self.time["decode_steps"] += int(kept.max())
                self.time["row_steps"] += int(kept.max()) * int(active.sum())
            queries, q_rows, obs_texts = [], [], {}
            for i in np.nonzero(active)[0]:
                n = int(seg.count[i])
                ids = seg.tokens[i, :n].tolist()
                resp[i]["ids"] += ids
                resp[i]["mask"] += [1.0] * n
                resp[i]["logprobs"] += seg.logprobs[i, :n].tolist()
                resp[i]["routes"] += seg.routes[i, :n].tolist()
                end, d = self.end_turn(ids, int(seg.finish[i]), int(seg.stop_index[i]), len(resp[i]["ids"]),
                                       int(calls[i]), limit[i])
                finish[i] = d.finish
                if d.action == "tool":
                    calls[i] += 1
                if d.call:
                    queries.append(end.query)
                    q_rows.append(i)
                elif d.corrective:
                    obs_texts[i] = self.protocol.invalid_message
                turns[i].append({"tokens": n, "action": d.action, "query": end.query if d.action == "tool" else None,
                                 "observation": None})
            if queries:
                t = time.perf_counter()
                bodies = self.tool(queries, [meta[i] for i in q_rows])
                self.time["tool_s"] += time.perf_counter() - t
                for i, body in zip(q_rows, bodies):
                    obs_texts[i], body, replaced = self.observation(body, int(calls[i]))
                    turns[i][-1]["observation"] = body
                    if replaced:
                        turns[i][-1]["invalid_text"] = replaced
            self._observe(decoder, obs_texts, resp, finish, spans, tool_rows={int(i) for i in q_rows}, limit=limit)
        finish = [f or "budget" for f in finish]
        texts = self.texts(resp, spans)
        p_routes, resp = decoder.final_routes(prompts, resp)
        return assemble(prompts, p_routes, resp, uids, finish, turns, texts[0], reward_texts=texts[1],
                        observed=texts[2])

    def texts(self, resp: list[dict], spans: list[list]) -> tuple[list[str], list[str], list[list[str]]]:
        """Responses (ids, and their observations' `spans`) -> (response texts, reward texts, observed
        bodies): rollout.trajectory.reward_views."""
        decode = lambda ids: self.tok.decode(ids, skip_special_tokens=True)  # noqa: E731
        views = [reward_views(decode, self.protocol, r["ids"], sp) for r, sp in zip(resp, spans)]
        return [decode(r["ids"]) for r in resp], [v[0] for v in views], [v[1] for v in views]

    def _observe(self, decoder: Decoder, obs_texts: dict[int, str], resp: list[dict], finish: list,
                 spans: list[list], tool_rows: set, limit: list[int] | None = None) -> None:
        """Append each row's observation text (tokenised alone, capped) to its response through the
        decoder; a row it leaves no room in finishes with "length" instead. Each appended observation
        is recorded in `spans[row]` as (start, length, row in `tool_rows`: a tool result, not a
        corrective message), what `reward_views` blanks."""
        rc, b = self.rc, len(resp)
        fits = {}
        for i, text in obs_texts.items():
            ids = self.obs_ids(text)
            if observation_fits(len(resp[i]["ids"]), len(ids), rc.max_response_tokens if limit is None else limit[i]):
                fits[i] = ids
            else:
                finish[i] = "length"
        if not fits:
            return
        # the append (and the cache slots it takes) is sized to this batch's longest observation,
        # bucketed, not to the cap: short SQL results and passages leave the cache, and every
        # later decode step's attention over it, that much smaller. A bucket past the cap is the cap
        # (to a multiple of 16): capped 192-token passages append 192 columns, not 256
        width = obs_columns(max(len(x) for x in fits.values()), rc)
        obs = np.zeros((b, width), np.int32)
        obs_len = np.zeros(b, np.int32)
        do = np.zeros(b, bool)
        for i, ids in fits.items():
            obs[i, :len(ids)], obs_len[i], do[i] = ids, len(ids), True
        t = time.perf_counter()
        obs_routes = decoder.observe(obs, obs_len, do, resp)
        self.time["append_s"] += time.perf_counter() - t
        if not getattr(decoder, "own_account", False):  # a two-model decoder books its hand-off appends itself
            self.time["appends"] += 1
        for i in np.nonzero(do)[0]:
            spans[i].append((len(resp[i]["ids"]), len(fits[i]), int(i) in tool_rows))
            resp[i]["ids"] += fits[i]
            resp[i]["mask"] += [0.0] * len(fits[i])
            resp[i]["logprobs"] += [0.0] * len(fits[i])
            resp[i]["routes"] += obs_routes[i, :obs_len[i]].tolist()


class SinglePolicy:
    """The agent loop's decoder (`Decoder`) of one model (+ adapters) that writes every token: a
    prefill, then per turn one decode segment, and observations appended into its KV cache."""

    def __init__(self, agent: Agent, base, adapters, prompts: list[list[int]], seed: int, row_offset: int = 0):
        self.agent, self.spec, self.adapters = agent, agent.spec, adapters
        self.base = decode_params(base, agent.rc.decode_layout)  # the decode loop's layout (memoised if frozen)
        tokens, positions, rows, self.t_prompt = agent.prompt_batch(prompts)
        self.seg_bucket = bucket(agent.rc.max_tokens_per_turn)
        cache = new_cache(self.spec.model, tokens.shape[0], cache_bucket(self.t_prompt + self.seg_bucket),
                          self.spec.placement)
        self.state, prompt_routes = prefill(self.base, adapters, tokens, positions, cache, jax.random.PRNGKey(seed),
                                            rows, row_offset, spec=self.spec, sampling=agent.row_sampling(len(prompts)))
        self.prompt_routes = np.asarray(prompt_routes)

    def segment(self, active: np.ndarray, enabled: np.ndarray, budget: np.ndarray, resp) -> Segment:
        self.state = ensure_capacity(self.state, cache_used(self.state) + self.seg_bucket, self.spec.placement)
        self.state, seg = run_segment(self.base, self.adapters, self.state, active, enabled, budget, spec=self.spec,
                                      length=self.seg_bucket, gather_rows=self.agent.rc.gather_rows)
        return seg

    def observe(self, obs: np.ndarray, obs_len: np.ndarray, do: np.ndarray, resp) -> np.ndarray:
        self.state = ensure_capacity(self.state, cache_used(self.state) + obs.shape[1] + 1 + self.seg_bucket,
                                     self.spec.placement)
        self.state, obs_routes = run_append(self.base, self.adapters, self.state, obs, obs_len, do, spec=self.spec,
                                            gather_rows=self.agent.rc.gather_rows)
        return np.asarray(obs_routes)

    def final_routes(self, prompts, resp):
        return [self.prompt_routes[i, self.t_prompt - len(p):].tolist() for i, p in enumerate(prompts)], resp


def obs_columns(longest: int, rc: RolloutConfig) -> int:
    """Columns of an observation append whose longest observation has `longest` tokens
    (`RolloutConfig.obs_multiple`): a power-of-two bucket, or a multiple of obs_multiple; never past the
    cap rounded up to 16."""
    width = bucket(longest) if not rc.obs_multiple else -(-longest // rc.obs_multiple) * rc.obs_multiple
    return min(-(-rc.max_obs_tokens // 16) * 16, width)


def observation_ids(tokenizer, protocol: Protocol, text: str, cap: int) -> list[int]:
    """An observation tokenised alone (never merged with the text around it), cut to `cap` tokens
    with its closing tag kept: what the agent appends and what a demonstration must contain.
    Only the protocol's framing (the first opening and the last closing observation tag) becomes
    tag ids; the body between is ordinary text, so a passage or a SQL cell holding "</information>"
    or "<search>" cannot move the router. Text without that framing is the protocol's own (the
    invalid-action message) and keeps its tags."""
    start, end = text.find(protocol.obs_open), text.rfind(protocol.obs_close)
    framed = 0 <= start and start + len(protocol.obs_open) <= end
    ids = encode_text(tokenizer, text, [(start + len(protocol.obs_open), end)] if framed else [])
    if len(ids) <= cap:
        return ids
    tail = tokenizer.encode(protocol.obs_close + "\n\n", add_special_tokens=False)
    if cap <= len(tail):
        raise ValueError(f"observation cap {cap} leaves no room beside its {len(tail)}-token closing tail")
    return ids[:cap - len(tail)] + tail


def tool_for(protocol: Protocol, tool: Any) -> ToolFn:
    """Adapts a RetrievalTool (queries) or SQLiteTool (queries, db paths) to the agent's ToolFn."""
    if protocol.name == "sql":
        return lambda queries, metas: tool.batch(queries, [m["db_path"] for m in metas])
    return lambda queries, metas: tool.batch(queries)
