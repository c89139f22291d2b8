"""What a request to the serving engine (serve.engine) is, and what the caller holds while it runs:
`Request` (prompt ids and sampling settings), `Generation` (the response so far, its events, its
trajectory), the engine's refusals, and `route_counts` (generated tokens per adapter)."""

from __future__ import annotations

import collections
import concurrent.futures
import dataclasses
import logging
import threading
import time
from typing import Callable

log = logging.getLogger(__name__)


@dataclasses.dataclass(frozen=True)
class Request:
    """One generation. `prompt`: token ids (chat template applied); `max_tokens`: the response budget
    (generated + observation tokens, as rollout.max_response_tokens; 0: the engine's); `tools`: run
    the tool loop (off: the tool stop is disabled and the model answers without searching)."""
    prompt: tuple[int, ...]
    max_tokens: int = 0
    temperature: float = 0.0
    top_p: float = 1.0
    seed: int = 0
    tools: bool = True
    # the draws of row `row` of a batch sampled with `seed` (rollout.sampler.initial_keys); 0: a one-prompt
    # batch. An evaluation on the engine passes its batch's seed and the row, and draws as the batch would
    row: int = 0
    meta: dict = dataclasses.field(default_factory=dict)  # what the tool needs per request (SQL: db_path)

    def __post_init__(self):
        object.__setattr__(self, "prompt", tuple(int(t) for t in self.prompt))  # hashable, comparable to prefixes
        if not self.prompt:
            raise ValueError("a request needs a non-empty prompt")
        if self.temperature < 0 or not 0 < self.top_p <= 1 or self.max_tokens < 0 or self.row < 0:
            raise ValueError(f"temperature={self.temperature} (≥ 0), top_p={self.top_p} (in (0, 1]), "
                             f"max_tokens={self.max_tokens} (≥ 0), row={self.row} (≥ 0)")


class EngineClosed(RuntimeError):
    """The engine was closed before the request finished."""


class Generation:
    """A request in flight: its response so far, turn records and events (`stream()` yields text /
    token deltas as segments land; `result()` waits for the end)."""

    def __init__(self, request: Request, uid: int, limit: int, listener: Callable[[dict], None] | None = None):
        self.request, self.uid, self.limit = request, uid, limit
        self.listener = listener  # called with every event, on the engine's thread (a server's queue feeder)
        self.ids: list[int] = []
        self.mask: list[float] = []
        self.logprobs: list[float] = []
        self.routes: list[int] = []
        self.turns: list[dict] = []
        self.spans: list[tuple[int, int, bool]] = []
        self.turn_ids: list[int] = []
        self.turn_cap = 0
        self.turn_count = 0
        self.calls = 0
        self.finish: str | None = None
        self.error: BaseException | None = None
        self.recorded = False      # its pending token was returned by an earlier segment of this turn
        self.last_turn = False     # the agent loop's last turn: after its observation, "budget"
        self.cancelled = False
        self.tool: concurrent.futures.Future | None = None
        self.obs_text: str | None = None  # an observation (tool result or corrective message) to append
        self.obs_tool = False
        self.submitted = time.perf_counter()
        self.first_token: float | None = None
        self.finished_at: float | None = None
        self._events: collections.deque = collections.deque()
        self._cond = threading.Condition()

    # -- consumer side -----------------------------------------------------------------------
    def done(self) -> bool:
        return self.finish is not None or self.error is not None

    def result(self, timeout: float | None = None) -> dict:
        with self._cond:
            if not self._cond.wait_for(self.done, timeout):
                raise TimeoutError(f"request {self.uid} not finished after {timeout} s")
        if self.error is not None:
            raise self.error
        return self.trajectory()

    def stream(self, timeout: float | None = None):
        """Yields events as they land: {"kind": "tokens", "ids": [...]} for generated tokens,
        {"kind": "observation", "ids": [...], "text": ...}, {"kind": "tool", "query": ...}, and finally
        {"kind": "done", "finish": ...}."""
        while True:
            with self._cond:
                if not self._cond.wait_for(lambda: self._events or self.done(), timeout):
                    raise TimeoutError(f"request {self.uid}: no event for {timeout} s")
                events = list(self._events)
                self._events.clear()
                finished = self.done() and not events
            yield from events
            if finished:
                if self.error is not None:
                    raise self.error
                return

    def trajectory(self) -> dict:
        return {"uid": self.uid, "prompt": list(self.request.prompt), "ids": self.ids, "mask": self.mask,
                "logprobs": self.logprobs, "routes": self.routes, "turns": self.turns, "spans": self.spans,
                "finish": self.finish, "tool_calls": self.calls,
                "time_to_first_token_s": None if self.first_token is None else self.first_token - self.submitted,
                "latency_s": None if self.finished_at is None else self.finished_at - self.submitted}

    # -- engine side -------------------------------------------------------------------------
    def _emit(self, event: dict):
        with self._cond:
            self._events.append(event)
            self._cond.notify_all()
        self._tell(event)

    def _tell(self, event: dict):
        if self.listener is not None:
            try:
                self.listener(event)
            except Exception:  # noqa: BLE001 — a listener (e.g. a closed server loop) never fails the engine
                log.warning("request %d: its listener failed on a %s event", self.uid, event["kind"], exc_info=True)

    def _end(self, finish: str | None = None, error: BaseException | None = None):
        with self._cond:
            self.finish = finish if error is None else (finish or "error")
            self.error = error
            self.finished_at = time.perf_counter()
            self._events.append({"kind": "done", "finish": self.finish})
            self._cond.notify_all()
        self._tell({"kind": "done", "finish": self.finish})


class Overloaded(RuntimeError):
    """The engine's waiting queue is full: retry later (a server answers 429 with Retry-After)."""


def route_counts(routes: list[int], mask: list[float], names: dict[int, str] | None = None) -> dict[str, int]:
    """Generated tokens (mask 1) per route id, named by `names` (DART: 0 reasoning, 1 tool); a negative
    route (no adapter) is "base"."""
    out: dict[str, int] = {}
    for r, m in zip(routes, mask):
        if m:
            key = (names or {}).get(int(r), "base" if int(r) < 0 else str(r))
            out[key] = out.get(key, 0) + 1
    return out
