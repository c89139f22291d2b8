"""A continuous-batching engine over the JAX sampler: requests join the running decode batch between
segments and leave when they finish or pause for a tool; a freed slot is refilled at once.

    Engine(agent, base, adapters, slots=16, segment=16)
    gen = engine.submit(Request(prompt_ids, max_tokens=..., temperature=..., top_p=..., seed=...))
    engine.run_until_idle()          # or engine.start(): a background thread steps while work exists
    gen.result()                     # the trajectory: ids, log-probs, routes, turns, finish, text

Device side: one DecodeState of `slots` rows whose KV cache has a write index per row
(models.cache), so each row writes where it is and a refilled row starts again at slot 0. A step
  1. appends the observations of rows whose tool call came back: encoded over just those rows, in pieces
     of 1, 2, 4, … rows with no padding row (5 rows: 4 + 1; encoding is compute-bound, so a padding
     row costs a real one's work), each piece padded to its own width (`rollout.gather.append_rows`,
     `slots.row_pieces`, `slots.obs_width`),
  2. admits waiting requests into free rows: their prompts are prefilled alone ([U, T], no other
     row's work, in the same exact pieces) and scattered into those rows (`slots.admit_rows`); a
     prompt that starts with a prefix the engine has seen shared (a system prompt and instructions)
     takes that prefix's KV slots, copied (`slots.place_prefix`), and only the rest of the prompt is
     encoded (as an observation is appended),
  3. decodes one segment of at most `segment` tokens for every running row (sampler.decode_segment
     with each row's stop history, so a turn may span segments), the running rows gathered into a
     bucket of 1, 2, 4, … rows when they are fewer than the slots (`rollout.gather.decode_rows`),
  4. hands each row's tokens to its request; a row whose turn ended is decided as the agent loop
     decides (rollout.agent.Agent.end_turn): answer / invalid / length end it and free the row; a
     tool call pauses it; the step's tool calls run as one batch on the tool worker, outside the
     decode step.
Compiled shapes are bucketed (prefill width and rows, observation width, cache capacity), so a new
request only compiles a shape the engine has not met yet; `warmup()` compiles the common ones first.

Prefix reuse (serve.prefixes): a prompt that starts with ≥ `min_prefix` tokens of a recent prompt
makes them a shared prefix, prefilled once; later prompts that start with it skip its forward. Identical
prompts admitted in one step (a GRPO group's samples: `share_identical`, as the batch sampler's
`rollout.share_prompt_prefill`) are prefilled once, the whole prompt held as such a prefix.

Each request samples with its own temperature, top-p and seed (top-k is the engine's), keyed by
(seed, position) as the batch sampler keys row 0 of a one-prompt batch: a request's tokens and
log-probs are what it gets decoded alone, whatever else is in flight (tests/serve/test_engine.py).
"""

from __future__ import annotations

import collections
import concurrent.futures
import itertools
import logging
import threading
import time
from typing import Callable

import jax
import jax.numpy as jnp
import numpy as np

from dart_jax.models import cache as cache_lib
from dart_jax.models.generate import left_pad
from dart_jax.rollout.agent import Agent
from dart_jax.rollout.gather import append_rows, decode_rows, row_bucket
from dart_jax.rollout.placement import decode_params
from dart_jax.rollout.sampler import (
    LENGTH,
    STOPPED,
    DecodeState,
    append,
    bucket,
    cache_bucket,
    decode_segment,
    grow_state,
    prefill,
    stop_window,
)
from dart_jax.rollout.sampling import RowSampling
from dart_jax.rollout.turn import observation_fits
from dart_jax.serve import warmup as warmup_lib
from dart_jax.serve.prefixes import PrefixCache
from dart_jax.serve.requests import EngineClosed, Generation, Overloaded, Request
from dart_jax.serve.slots import (
    admit_rows,
    obs_width,
    place_prefix,
    request_key,
    reset_rows,
    row_pieces,
)

log = logging.getLogger(__name__)


class Engine:
    """Continuous batching of agent rollouts over `slots` rows (module doc). `agent` supplies the model
    config, tokenizer, protocol, tool and rollout settings (rollout.agent.Agent); `base`, `adapters`
    the policy (DART: both adapters, routed per token). `segment`: tokens per decode segment — the
    most a waiting request waits for a slot to free up, and the host round trip's amortisation.
    `tool_workers`: threads running the tool outside the decode step. Each step's calls go to the tool as
    one batch (one encoder forward for a step's searches; SQLite runs a batch on its own worker pool);
    with one worker (the default) batches run one at a time, which a tool that is not thread-safe (a
    tokenizer, a GPU faiss index) needs; more workers only for a tool safe to call from several threads.
    `min_prefix`, `prefixes`: shared-prefix reuse (serve.prefixes; `min_prefix` ≤ 0 turns it off);
    `share_identical`: identical prompts admitted together are prefilled once (module doc; rollouts turn it
    on for a GRPO group's samples; off for serving, where its per-width programs are not warmed up)."""

    def __init__(self, agent: Agent, base, adapters, slots: int = 16, segment: int = 16, tool_workers: int = 1,
                 max_waiting: int = 1024, tool: Callable[[list[str], list[dict]], list[str]] | None = None,
                 capacity: int = 0, min_prefix: int = 32, prefixes: int = 8, share_identical: bool = False):
        """`capacity`: KV slots per row allocated up front (0: grown on demand in 256-slot steps, each new
        size compiling the step functions once — on an accelerator with memory to spare, allocate the
        longest request's need, `max_capacity()`, and no growth ever compiles on the hot path).
        `min_prefix`: the shortest prompt prefix shared with a recent prompt that is prefilled once and
        reused (0: off); `prefixes`: how many such prefixes are kept (LRU)."""
        if slots < 1 or segment < 1:
            raise ValueError(f"slots={slots} and segment={segment} must be ≥ 1")
        self.agent, self.spec, self.rc = agent, agent.spec, agent.rc
        self.tool = tool or agent.tool
        self.base = decode_params(base, self.rc.decode_layout)
        self.adapters = adapters
        self.slots, self.segment = slots, bucket(segment)
        self.share_identical = share_identical
        self.max_waiting = max_waiting
        self.window = stop_window(self.spec)
        self.rows: list[Generation | None] = [None] * slots
        self.waiting: collections.deque[Generation] = collections.deque()
        self.pool = concurrent.futures.ThreadPoolExecutor(max(1, tool_workers), thread_name_prefix="engine-tool")
        self._uid = itertools.count()
        self._lock = threading.Lock()
        self._wake = threading.Condition(self._lock)
        self._thread: threading.Thread | None = None
        self._closed = False
        self.stats = collections.Counter()
        self.time: collections.Counter = collections.Counter()  # seconds per step phase (`step`)
        self._freed: set[int] = set()  # released rows whose cache index is still set
        self.failure: str | None = None  # the last step failure (health reports it)
        self._calls: list = []  # (future, query, meta) of this step's tool calls
        self.prefixes = PrefixCache(self._prefill_prefix, obs_width(self.rc.max_obs_tokens), self.stats,
                                    min_prefix=min_prefix, size=prefixes)
        self.initial_capacity = cache_bucket(capacity or self.segment + 1)
        self.state = self._empty_state(self.initial_capacity)

    # -- state --------------------------------------------------------------------------------
    def _empty_state(self, capacity: int) -> DecodeState:
        b = self.slots
        cache = cache_lib.init_cache(self.spec.model, b, capacity, per_row=True)
        # a buffer of its own per field: the step functions donate the state, and one buffer donated
        # twice is an error (met on the first step when `capacity` is allocated up front)
        return DecodeState(cache=cache, pending=jnp.zeros((b,), jnp.int32), pending_lp=jnp.zeros((b,), jnp.float32),
                           pending_route=jnp.full((b,), -1, jnp.int32), router=jnp.zeros((b,), bool),
                           next_pos=jnp.zeros((b,), jnp.int32),
                           keys=jnp.stack([request_key(0)] * b),
                           sampling=RowSampling.of(np.zeros(b), np.ones(b)))

    def capacity(self) -> int:
        return int(self.state.cache["pos"].shape[1])

    def max_capacity(self) -> int:
        """KV slots the longest request can need: the longest prompt the context admits with one turn
        of response, its response budget, an observation chunk and a segment."""
        return cache_bucket(self.spec.model.max_position_embeddings + bucket(self.rc.max_obs_tokens)
                            + self.segment + 1)

    def _ensure(self, need: int):
        if need > self.capacity():
            self.state = grow_state(self.state, capacity=cache_bucket(need))
            self.stats["cache_grows"] += 1

    def _indices(self) -> np.ndarray:
        return np.asarray(jax.device_get(self.state.cache["index"]))

    # -- client side --------------------------------------------------------------------------
    def submit(self, request: Request, listener: Callable[[dict], None] | None = None) -> Generation:
        """Queue a request (thread-safe). Raises `Overloaded` when the waiting queue is full. `listener`
        receives the generation's events as they land (on the engine's thread: keep it short)."""
        prompt_len = len(request.prompt)
        context = self.spec.model.max_position_embeddings
        if prompt_len >= context:
            raise ValueError(f"a prompt of {prompt_len} tokens leaves no room for a response in the model's "
                             f"context of {context} positions")
        limit = self.agent.response_limit(prompt_len)
        if request.max_tokens:
            limit = min(limit, request.max_tokens)
        gen = Generation(request, next(self._uid), limit, listener)
        with self._wake:
            if self._closed:
                raise EngineClosed("the engine is closed")
            if len(self.waiting) >= self.max_waiting:
                raise Overloaded(f"{len(self.waiting)} requests waiting (max_waiting={self.max_waiting})")
            self.waiting.append(gen)
            self._wake.notify_all()
        return gen

    def load(self) -> dict:
        with self._lock:
            busy = sum(g is not None for g in self.rows)
            return {"slots": self.slots, "busy": busy, "waiting": len(self.waiting),
                    "paused": sum(g is not None and g.tool is not None for g in self.rows)}

    # -- the loop ------------------------------------------------------------------------------
    def cancel(self, gen: Generation):
        """Stop a request (a client that went away, a deadline): a waiting one ends "cancelled" now, a
        running one at the next step."""
        gen.cancelled = True
        with self._wake:
            waiting = gen in self.waiting
            if waiting:
                self.waiting.remove(gen)
            self._wake.notify_all()
        if waiting:
            gen._end("cancelled")

    def step(self) -> bool:
        """One engine iteration (module doc). -> whether anything is still in flight or waiting."""
        for i, g in enumerate(self.rows):
            if g is not None and g.cancelled:
                if g.tool is not None:
                    g.tool.cancel()
                self._release(i, "cancelled")
        if self._freed:  # finished rows' indices back to 0: attention and growth go by the live rows
            rows = np.zeros(self.slots, bool)
            rows[list(self._freed)] = True
            self.state = reset_rows(self.state, jnp.asarray(rows))
            self._freed.clear()
        t0 = time.perf_counter()
        self._resume()
        t1 = time.perf_counter()
        admitted = self.stats["admitted"]
        self._admit()
        if self.stats["admitted"] != admitted:  # its device work counted as its own (no sync when none ran)
            self.state.pending.block_until_ready()
        t2 = time.perf_counter()
        ran = self._decode()
        # where the engine's time goes (seconds, host-side wall clock: each phase waits for its device work;
        # "append" includes the row reset dispatched before it, "decode" the host work on its tokens and the
        # tool calls' hand-off; the wait after an admission costs one host sync)
        self.time["append"] += t1 - t0
        self.time["admit"] += t2 - t1
        self.time["decode"] += time.perf_counter() - t2
        with self._lock:
            busy = any(g is not None for g in self.rows) or bool(self.waiting)
            paused = [g.tool for g in self.rows if g is not None and g.tool is not None]
        if busy and not ran and paused and not any(f.done() for f in paused):
            # every row waits on its tool: sleep until one returns (or a new request arrives)
            concurrent.futures.wait(paused, timeout=0.05, return_when=concurrent.futures.FIRST_COMPLETED)
        return busy

    def run_until_idle(self, timeout: float | None = None):
        start = time.perf_counter()
        while self.step():
            if timeout is not None and time.perf_counter() - start > timeout:
                raise TimeoutError(f"engine still busy after {timeout} s")

    def start(self) -> "Engine":
        """Step on a background thread while there is work (for a server)."""
        if self._thread is None:
            self._thread = threading.Thread(target=self._serve, name="engine", daemon=True)
            self._thread.start()
        return self

    def _serve(self):
        while True:
            with self._wake:
                self._wake.wait_for(lambda: self._closed or self.waiting or any(g is not None for g in self.rows))
                if self._closed:
                    return
            try:
                self.step()
            except Exception as e:  # a device or tool failure: fail the requests in flight, keep serving
                log.exception("engine step failed; failing the requests in flight")
                self.failure = f"{type(e).__name__}: {e}"
                self._fail_all(e)
                # the step donated the state: start again from an empty one of the same size
                self.state = self._empty_state(self.capacity() if not self.state.cache["pos"].is_deleted()
                                               else self.initial_capacity)

    def close(self):
        with self._wake:
            self._closed = True
            self._wake.notify_all()
        if self._thread is not None:
            self._thread.join()  # a step in flight (or compiling) finishes first
        self._fail_all(EngineClosed("the engine was closed"))
        self.pool.shutdown(wait=False, cancel_futures=True)

    def _fail_all(self, error: BaseException):
        with self._lock:
            gens = [g for g in self.rows if g is not None] + list(self.waiting)
            self.rows = [None] * self.slots
            self.waiting.clear()
        for g in gens:
            if not g.done():
                g._end(error=error)

    # -- 1. observations ----------------------------------------------------------------------
    def _resume(self):
        """Append the observations that are ready (tool results back, corrective messages) in one batch."""
        ready: dict[int, list[int]] = {}
        for i, g in enumerate(self.rows):
            if g is None:
                continue
            if g.tool is not None:
                if not g.tool.done():
                    continue
                fut, g.tool = g.tool, None
                try:
                    body = fut.result()[0]
                except Exception as e:  # a failing tool ends its request with the error, not the engine
                    self._release(i, error=e)
                    continue
                g.obs_text, body, replaced = self.agent.observation(body, g.calls)
                g.turns[-1]["observation"] = body
                if replaced:
                    g.turns[-1]["invalid_text"] = replaced
                g.obs_tool = True
            if g.obs_text is None:
                continue
            ids = self.agent.obs_ids(g.obs_text)
            g.obs_text = None
            if not observation_fits(len(g.ids), len(ids), g.limit):
                self._release(i, "length")
                continue
            ready[i] = ids
        if not ready:
            return
        obs_routes = self._append(ready)
        for i, ids in ready.items():
            g = self.rows[i]
            g.spans.append((len(g.ids), len(ids), g.obs_tool))
            g.ids += ids
            g.mask += [0.0] * len(ids)
            g.logprobs += [0.0] * len(ids)
            g.routes += obs_routes[i][:len(ids)]
            g.recorded = False
            g._emit({"kind": "observation", "ids": ids, "text": g.turns[-1].get("observation") if g.obs_tool else
                     self.agent.protocol.invalid_message})
            if g.last_turn:
                self._release(i, "budget")
            else:
                self._start_turn(g)
        self.stats["appends"] += 1

    def _append(self, ready: dict[int, list[int]]) -> dict[int, list[int]]:
        """Each ready row's pending token and ids encoded -> {row: the routes of its ids}. Encoding is
        compute-bound, so no padding row is encoded: every row ready, the batch appends in place with a mask;
        else the rows are gathered in pieces of exact row buckets (`slots.row_pieces`,
        `rollout.gather.append_rows`), longest ids first, each piece padded to its own width (`slots.obs_width`)."""
        order = sorted(ready, key=lambda i: -len(ready[i]))
        self._ensure(int(self._indices().max()) + obs_width(len(ready[order[0]])) + 1)
        done, start = [], 0
        for u in row_pieces(len(order), self.slots):
            take, start = order[start:start + u], start + u
            width = obs_width(len(ready[take[0]]))
            obs, obs_len = np.zeros((u, width), np.int32), np.zeros(u, np.int32)
            for k, i in enumerate(take):
                obs[k, :len(ready[i])], obs_len[k] = ready[i], len(ready[i])
            if u == self.slots:  # every row: the batch append in place, no gather or scatter
                full, full_len = np.zeros_like(obs), np.zeros_like(obs_len)
                full[take], full_len[take] = obs, obs_len
                self.state, routes = append(self.base, self.adapters, self.state, jnp.asarray(full),
                                            jnp.asarray(full_len), jnp.ones(u, bool), spec=self.spec)
                routes = routes[jnp.asarray(take)]
            else:
                self.state, routes = append_rows(self.base, self.adapters, self.state, jnp.asarray(take, jnp.int32),
                                                 jnp.asarray(obs), jnp.asarray(obs_len), spec=self.spec)
            done.append((take, routes))
            self.stats["append_rows"] += u
            self.stats["append_columns"] += u * width
        out = {}  # the pieces' routes fetched once all are dispatched
        for take, routes in zip([t for t, _ in done], jax.device_get([r for _, r in done])):
            out.update({i: routes[k, :len(ready[i])].tolist() for k, i in enumerate(take)})
        return out

    # -- 2. admission -------------------------------------------------------------------------
    def _admit(self):
        dropped = []
        with self._lock:
            free = [i for i, g in enumerate(self.rows) if g is None]
            take = []
            while free and self.waiting:
                g = self.waiting.popleft()
                if g.cancelled:
                    dropped.append(g)
                    continue
                i = free.pop(0)
                self.rows[i] = g
                self._freed.discard(i)
                take.append((i, g))
        for g in dropped:
            g._end("cancelled")
        # prompts of one width bucket are prefilled together: a request's prefill shape is its own;
        # identical prompts admitted together (a GRPO group's samples) are prefilled once and placed in
        # each row; prompts that start with a shared prefix take its KV slots and encode only the rest
        same = collections.Counter(g.request.prompt for _, g in take) if self.share_identical else {}
        groups: dict[int, list] = {}
        shared: dict[tuple, tuple[DecodeState, list]] = {}  # by prefix: learnt ones, and whole prompts
        grouped = 0
        for i, g in take:
            prompt = g.request.prompt
            if same.get(prompt, 0) > 1 and len(prompt) > 1:
                if prompt not in shared:  # (a learnt prefix equal to this prompt holds the same state)
                    shared[prompt] = (self._prefill_prefix(prompt), [])
                    self.stats["group_prefills"] += 1
                shared[prompt][1].append((i, g))
                grouped += 1
                continue
            found = self.prefixes.find(prompt)
            if found is None:
                groups.setdefault(cache_bucket(len(prompt)), []).append((i, g))
            else:
                shared.setdefault(found[0], (found[1], []))[1].append((i, g))
        for group in groups.values():
            self._admit_group(group)
        if shared:
            self._admit_shared(shared, grouped)

    def _prefill_prefix(self, key: tuple) -> DecodeState:
        """A one-row state of prefix `key`: all but its last token encoded (left-padded to a width bucket),
        the last held pending (sampler.prefill(hold_last=True))."""
        width = cache_bucket(len(key))
        tokens, positions = self._left_padded([list(key)], width)
        cache = cache_lib.init_cache(self.spec.model, 1, width - 1)
        state, _ = prefill(self.base, self.adapters, tokens, positions, cache, jax.random.PRNGKey(0), spec=self.spec,
                           hold_last=True)
        return state

    def _admit_shared(self, shared: dict[tuple, tuple[DecodeState, list]], grouped: int = 0):
        """Rows that start from a shared prefix: its state placed in them (one call per prefix), then the
        rest of every such prompt appended in one batch (sampler.append), which samples each first token.
        `grouped` of them are whole prompts admitted several times (their rest: the held last token)."""
        rest: dict[int, list[int]] = {}
        for key, (prefix, take) in shared.items():
            self._ensure(int(prefix.cache["pos"].shape[1]) + self.segment + 1)
            self.state = place_prefix(self.state, *self._row_settings(take), prefix=prefix)
            rest.update({i: list(g.request.prompt[len(key):]) for i, g in take})
        self._append(rest)
        for _, take in shared.values():
            for _, g in take:
                g.recorded = False
                self._start_turn(g)
        self.stats["admits"] += 1
        self.stats["admitted"] += len(rest)
        self.stats["group_admitted"] += grouped
        self.stats["prefix_admitted"] += len(rest) - grouped

    def _left_padded(self, prompts: list[list[int]], width: int) -> tuple[jnp.ndarray, jnp.ndarray]:
        """Prompts left-padded to `width` columns -> (tokens, positions: −1 on padding)."""
        pad = self.agent.tok.pad_token_id if self.agent.tok.pad_token_id is not None else 0
        tokens, positions = left_pad(prompts, pad)
        extra = width - tokens.shape[1]
        return (jnp.pad(tokens, ((0, 0), (extra, 0)), constant_values=pad),
                jnp.pad(positions, ((0, 0), (extra, 0)), constant_values=-1))

    def _row_settings(self, take: list) -> tuple[jnp.ndarray, jax.Array, jnp.ndarray, jnp.ndarray]:
        """(rows, keys, temperatures, top-ps) of admitted requests `take` [(row, generation)], padded to
        their row bucket (padding rows are out of range: dropped)."""
        u = row_bucket(len(take), self.slots)
        rows = np.full(u, self.slots, np.int32)
        rows[:len(take)] = [i for i, _ in take]
        keys = jnp.stack([request_key(g.request.seed, g.request.row) for _, g in take]
                         + [request_key(0)] * (u - len(take)))
        temp = np.zeros(u, np.float32)
        top_p = np.ones(u, np.float32)
        temp[:len(take)] = [g.request.temperature for _, g in take]
        top_p[:len(take)] = [g.request.top_p for _, g in take]
        return jnp.asarray(rows), keys, jnp.asarray(temp), jnp.asarray(top_p)

    def _admit_group(self, take: list):
        """Prompts of one width bucket prefilled and placed in their rows, in pieces of exact row buckets
        (`slots.row_pieces`: prefill is compute-bound, so no padding prompt is encoded)."""
        width = cache_bucket(max(len(g.request.prompt) for _, g in take))
        self._ensure(width + self.segment + 1)
        start = 0
        for u in row_pieces(len(take), self.slots):
            piece, start = take[start:start + u], start + u
            tokens, positions = self._left_padded([list(g.request.prompt) for _, g in piece], width)
            self.state = admit_rows(self.base, self.adapters, self.state, tokens, positions,
                                    *self._row_settings(piece), spec=self.spec)
            self.stats["prefill_rows"] += u
        for _, g in take:
            g.recorded = False
            self._start_turn(g)
        self.stats["admits"] += 1
        self.stats["admitted"] += len(take)

    def _start_turn(self, g: Generation):
        """A new turn: its token budget as the agent loop gives a segment (rollout.agent.Agent.run)."""
        g.turn_ids = []
        room = g.limit - len(g.ids)
        g.turn_cap = int(np.clip(min(room, self.rc.max_tokens_per_turn), 1, bucket(self.rc.max_tokens_per_turn)))

    # -- 3. decode ------------------------------------------------------------------------------
    def _decode(self) -> bool:
        b, n_stops = self.slots, len(self.spec.stops)
        active = np.zeros(b, bool)
        enabled = np.ones((b, n_stops), bool)
        budget = np.ones(b, np.int32)
        history = np.full((b, self.window), -1, np.int32)
        recorded = np.zeros(b, bool)
        for i, g in enumerate(self.rows):
            if g is None or g.tool is not None or g.obs_text is not None or g.done():
                continue
            active[i] = True
            if g.calls >= self.rc.max_turns or not g.request.tools:  # the answer-only segment
                enabled[i, self.agent.stop_groups["tool"]] = False
            budget[i] = min(g.turn_cap - len(g.turn_ids), self.segment)
            tail = g.turn_ids[-self.window:]
            if tail:
                history[i, -len(tail):] = tail
            recorded[i] = g.recorded
        if not active.any():
            return False
        self._ensure(int(self._indices().max()) + self.segment + 1)
        live = np.nonzero(active)[0]
        u = row_bucket(len(live), b)
        if u == b:  # every row's worth: the whole batch with a mask, no gather or scatter
            self.state, seg = decode_segment(self.base, self.adapters, self.state, jnp.asarray(active),
                                             jnp.asarray(enabled), jnp.asarray(budget), jnp.asarray(history),
                                             jnp.asarray(recorded), spec=self.spec, length=self.segment)
            at = live
        else:  # the decoding rows gathered into a bucket of rows (rollout.gather.decode_rows); padding inactive
            rows = np.full(u, b, np.int32)
            rows[:len(live)] = live
            pick = np.minimum(rows, b - 1)
            self.state, seg = decode_rows(self.base, self.adapters, self.state, jnp.asarray(rows),
                                          jnp.asarray(active[pick] & (rows < b)), jnp.asarray(enabled[pick]),
                                          jnp.asarray(budget[pick]), jnp.asarray(history[pick]),
                                          jnp.asarray(recorded[pick]), spec=self.spec, length=self.segment)
            at = np.arange(len(live))
        seg = jax.device_get(seg)
        self.stats["segments"] += 1
        self.stats["segment_rows"] += int(u)
        now = time.perf_counter()
        for i, k in zip(live, at):
            g = self.rows[i]
            n = int(seg.count[k])
            ids = seg.tokens[k, :n].tolist()
            if n and g.first_token is None:
                g.first_token = now
            g.ids += ids
            g.mask += [1.0] * n
            g.logprobs += seg.logprobs[k, :n].tolist()
            g.routes += seg.routes[k, :n].tolist()
            g.turn_ids += ids
            g.recorded = True
            self.stats["tokens"] += n
            if ids:
                g._emit({"kind": "tokens", "ids": ids})
            stopped = int(seg.finish[k]) == STOPPED
            if stopped or len(g.turn_ids) >= g.turn_cap:
                self._end_turn(int(i), g, STOPPED if stopped else LENGTH, int(seg.stop_index[k]))
        self._flush_calls()
        return True

    def _flush_calls(self):
        """The tool calls this step's rows made, as one batched call on the tool worker."""
        if self._calls:
            calls, self._calls = self._calls, []
            self.pool.submit(self._run_tool, calls)
            self.stats["tool_batches"] += 1

    def _run_tool(self, calls: list):
        live = [c for c in calls if c[0].set_running_or_notify_cancel()]  # a cancelled row's call is dropped
        if not live:
            return
        try:
            bodies = self.tool([q for _, q, _ in live], [m for _, _, m in live])
            if len(bodies) != len(live):
                raise RuntimeError(f"the tool returned {len(bodies)} results for {len(live)} queries")
        except Exception as e:  # noqa: BLE001 — each row's request ends with the error (`_resume`)
            for f, _, _ in live:
                f.set_exception(e)
            return
        for (f, _, _), body in zip(live, bodies):
            f.set_result([body])

    def _end_turn(self, i: int, g: Generation, finish: int, stop_index: int):
        # tools off: every turn is the answer-only one (no corrective message asking for a search)
        calls = g.calls if g.request.tools else max(g.calls, self.rc.max_turns)
        end, d = self.agent.end_turn(g.turn_ids, finish, stop_index, len(g.ids), calls, g.limit)
        g.turns.append({"tokens": len(g.turn_ids), "action": d.action,
                        "query": end.query if d.action == "tool" else None, "observation": None})
        g.turn_count += 1
        if d.action == "tool":
            g.calls += 1
        if d.finish is not None:
            self._release(i, d.finish)
            return
        if d.call:
            g._emit({"kind": "tool", "query": end.query})
            g.tool = concurrent.futures.Future()  # resolved by this step's batched tool call (_flush_calls)
            self._calls.append((g.tool, end.query, dict(g.request.meta)))
        elif d.corrective:
            g.obs_text, g.obs_tool = self.agent.protocol.invalid_message, False
        if g.turn_count >= self.agent.turn_limit():  # the agent loop's last turn: still going means "budget"
            if g.tool is None and g.obs_text is None:
                self._release(i, "budget")
            else:
                g.last_turn = True  # its observation joins the response first, as in the agent loop

    def _release(self, i: int, finish: str | None = None, error: BaseException | None = None):
        with self._lock:
            g, self.rows[i] = self.rows[i], None
            self._freed.add(i)
        if g is not None:
            g._end(finish, error)
            self.stats["finished"] += 1

    def warmup_prefixes(self):
        """Compile the placement of each learnt shared prefix into every row bucket (serve.warmup)."""
        warmup_lib.place_prefixes(self)

    def warmup(self, prompt_lens: tuple[int, ...] = (128,)):
        """Compile what requests meet before they do (serve.warmup.compile_steps)."""
        warmup_lib.compile_steps(self, tuple(prompt_lens))


__all__ = ["Engine", "EngineClosed", "Generation", "Overloaded", "Request", "request_key"]
