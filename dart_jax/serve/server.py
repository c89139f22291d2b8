"""An OpenAI-compatible chat server over the continuous-batching engine (serve.engine), with the agent's
tool loop server-side and DART's per-token routing inside every request.

    POST /v1/chat/completions   (OpenAI's chat completions: messages, temperature, top_p, max_tokens /
                                 max_completion_tokens, seed, stop, stream, n = 1)
    GET  /v1/models             the one model served
    GET  /health                {"status": "ok", slots, busy, waiting, paused}

The assistant message's content is the agent's whole transcript — its reasoning, each tool call and
the observation it got back, and the answer — as the policy wrote and read it; streamed, every
segment and observation arrives as a delta. The response carries an extension field `dart`:
{"answer", "finish" (the agent's: answer / invalid / length / budget / cancelled), "tool_calls",
"turns": [{"action", "query", "observation"}], "routes": {"reasoning": n, "tool": n} (generated tokens
per adapter), "response_tokens"}; a streamed response sends it in its last chunk. A request may set
`dart` too: {"tools": false} (no tool loop), {"template": "raw" | "search_r1" | "lab"} (how the messages
become the prompt; default the server's), {"db_id": ...} (NL2SQL: the database under --db-root).

Prompts: with a task template (search_r1 / lab / sql, the run's) the last user message is the
question, put in the prompt the policy was trained on; "raw" renders every message with the chat
template. Message text is untrusted: tags typed by a user are ordinary text, never the router's.

Hardening: JSON errors are 400 with the field named; a full engine queue is 429 with Retry-After; a
closed engine 503; a request not done by its deadline (`request_timeout_s`) is cancelled and answered
504 (streamed: its stream ends with finish_reason "length" and dart.finish "cancelled"); a streaming
client that goes away cancels its request. Binds to loopback unless told otherwise.
"""

from __future__ import annotations

import asyncio
import json
import logging
import os
import random
import threading
import time
import uuid

from aiohttp import web

from dart_jax.data.prompts import LAB_TEMPLATE, SEARCH_R1_TEMPLATE, qa_prompt, sql_prompt
from dart_jax.serve.engine import Engine
from dart_jax.serve.requests import EngineClosed, Overloaded, Request, route_counts
from dart_jax.tokenization.tokenizer import Untrusted, encode_chat

log = logging.getLogger(__name__)
TEMPLATES = ("raw", "search_r1", "lab", "sql")
FINISH = {"answer": "stop", "invalid": "stop", "length": "length", "budget": "length", "cancelled": "length",
          "stop": "stop"}


class BadRequest(ValueError):
    """A request body that does not say what the server needs (-> 400 with this message)."""


def prompt_ids(tokenizer, messages: list[dict], template: str, db_path: str | None = None) -> list[int]:
    """The policy's prompt for chat `messages` under `template` (module doc)."""
    if template not in TEMPLATES:
        raise BadRequest(f"template {template!r}; expected one of {TEMPLATES}")
    mark = Untrusted()
    if template == "raw":
        msgs = [{"role": m["role"], "content": mark(m["content"])} for m in messages]
        return encode_chat(tokenizer, msgs, untrusted=mark)
    users = [m for m in messages if m["role"] == "user"]
    if not users:
        raise BadRequest("messages: no user message to take the question from")
    question = users[-1]["content"]
    if template == "sql":
        if not db_path:
            raise BadRequest("an NL2SQL question needs its database: set dart.db_id")
        content = sql_prompt(question, db_path, "", mark)
    else:
        content = qa_prompt(question, mark, LAB_TEMPLATE if template == "lab" else SEARCH_R1_TEMPLATE)
    return encode_chat(tokenizer, [{"role": "user", "content": content}], untrusted=mark)


def _number(body: dict, name: str, default, lo: float, hi: float, kind=float, lo_open: bool = False):
    v = body.get(name, default)
    if v is None:
        return default
    if isinstance(v, bool) or not isinstance(v, (int, float)) or (kind is int and not float(v).is_integer()):
        raise BadRequest(f"{name} must be a number{' (an integer)' if kind is int else ''}, got {v!r}")
    if not (lo < v if lo_open else lo <= v) or v > hi:
        raise BadRequest(f"{name}={v} is out of range ({'(' if lo_open else '['}{lo}, {hi}])")
    return kind(v)


def _flag(body: dict, name: str, default: bool) -> bool:
    v = body.get(name, default)
    if v is None:
        return default
    if not isinstance(v, bool):
        raise BadRequest(f"{name} must be true or false, got {v!r}")
    return v


def parse_chat(body, default_template: str, db_root: str | None, max_tokens_cap: int,
               default_tools: bool = True) -> dict:
    """A chat-completions body -> the request's settings (BadRequest naming what is wrong). max_tokens
    above the server's response budget is cut to it; no seed: a random one (returned in dart.seed)."""
    if not isinstance(body, dict):
        raise BadRequest("the body must be a JSON object")
    messages = body.get("messages")
    if not isinstance(messages, list) or not messages:
        raise BadRequest("messages must be a non-empty list of {role, content}")
    for k, m in enumerate(messages):
        if not isinstance(m, dict) or m.get("role") not in ("system", "user", "assistant") \
                or not isinstance(m.get("content"), str):
            raise BadRequest(f"messages[{k}] must be {{role: system|user|assistant, content: str}}")
    if body.get("n", 1) != 1:
        raise BadRequest("n must be 1 (one choice per request; send several requests for more)")
    stop = body.get("stop") or []
    stop = [stop] if isinstance(stop, str) else stop
    if not isinstance(stop, list) or len(stop) > 4 or not all(isinstance(s, str) and s for s in stop):
        raise BadRequest("stop must be a non-empty string or a list of at most 4 of them")
    ext = body.get("dart") or {}
    if not isinstance(ext, dict):
        raise BadRequest("dart must be an object ({tools, template, db_id})")
    db_path = None
    if ext.get("db_id") is not None:
        db_id = str(ext["db_id"])
        if not db_root:
            raise BadRequest("dart.db_id given, but the server has no database root (--db-root)")
        if "/" in db_id or db_id.startswith("."):
            raise BadRequest(f"dart.db_id {db_id!r} is not a database name")
        db_path = os.path.join(db_root, db_id, f"{db_id}.sqlite")
        if not os.path.isfile(db_path):
            raise BadRequest(f"no database {db_id!r} under the server's database root")
    max_tokens = body.get("max_completion_tokens", body.get("max_tokens"))
    seed = body.get("seed")
    return {"messages": messages, "stream": _flag(body, "stream", False), "stop": stop,
            "temperature": _number(body, "temperature", 1.0, 0.0, 2.0),
            "top_p": _number(body, "top_p", 1.0, 0.0, 1.0, lo_open=True),
            "seed": random.randrange(2 ** 31) if seed is None else _number(body, "seed", 0, 0, 2 ** 31 - 1, int),
            "max_tokens": 0 if max_tokens is None else min(max_tokens_cap, _number(
                {"max_tokens": max_tokens}, "max_tokens", 0, 1, float("inf"), int)),
            "tools": _flag(ext, "tools", default_tools), "template": str(ext.get("template", default_template)),
            "db_path": db_path}


class ChatServer:
    """The HTTP front of one Engine (module doc). `model_id`: the name /v1/models lists and responses
    carry; `template`: the default prompt template; `route_names`: route id -> adapter name."""

    def __init__(self, engine: Engine, model_id: str, template: str = "search_r1", host: str = "127.0.0.1",
                 port: int = 8001, request_timeout_s: float = 600.0, db_root: str | None = None,
                 route_names: dict[int, str] | None = None, max_body: int = 1 << 20, default_tools: bool = True):
        if template not in TEMPLATES:
            raise ValueError(f"template {template!r}; expected one of {TEMPLATES}")
        self.engine, self.model_id, self.template = engine, model_id, template
        self.host, self.port, self.request_timeout_s, self.db_root = host, port, request_timeout_s, db_root
        self.route_names = route_names or {0: "reasoning", 1: "tool"}
        self.max_body = max_body
        self.default_tools = default_tools  # the tool loop when a request does not say (launch.serve --notools)
        self.tok = engine.agent.tok
        self._loop: asyncio.AbstractEventLoop | None = None
        self._stopped: asyncio.Event | None = None
        self._thread: threading.Thread | None = None
        self.stats = {"requests": 0, "rejected": 0, "timeouts": 0, "errors": 0}

    # -- handlers -----------------------------------------------------------------------------
    async def health(self, request: web.Request) -> web.Response:
        status = "ok" if self.engine.failure is None else "degraded"
        return web.json_response({"status": status, "model": self.model_id, **self.engine.load(), **self.stats,
                                  **({"last_failure": self.engine.failure} if self.engine.failure else {})})

    async def models(self, request: web.Request) -> web.Response:
        return web.json_response({"object": "list", "data": [{"id": self.model_id, "object": "model",
                                                              "created": 0, "owned_by": "dart_jax"}]})

    async def not_found(self, request: web.Request) -> web.Response:
        return _error(404, f"no route {request.method} {request.path}", "not_found")

    async def chat(self, request: web.Request) -> web.StreamResponse:
        self.stats["requests"] += 1
        try:
            body = json.loads(await request.read())
        except (ValueError, UnicodeDecodeError) as e:
            return _error(400, f"the body is not valid JSON: {e}")
        try:
            req = parse_chat(body, self.template, self.db_root, self.engine.rc.max_response_tokens,
                             self.default_tools)
            ids = prompt_ids(self.tok, req["messages"], req["template"], req["db_path"])
            ereq = Request(tuple(ids), max_tokens=req["max_tokens"], temperature=req["temperature"],
                           top_p=req["top_p"], seed=req["seed"], tools=req["tools"],
                           meta={"db_path": req["db_path"]} if req["db_path"] else {})
        except (BadRequest, ValueError, FileNotFoundError) as e:
            return _error(400, str(e))
        loop = asyncio.get_running_loop()
        events: asyncio.Queue = asyncio.Queue()
        try:
            gen = self.engine.submit(ereq, listener=lambda ev: loop.call_soon_threadsafe(events.put_nowait, ev))
        except Overloaded as e:
            self.stats["rejected"] += 1
            return _error(429, f"the server is busy: {e}; retry later", "rate_limit_exceeded", **{"Retry-After": "1"})
        except EngineClosed as e:
            return _error(503, str(e), "unavailable", **{"Retry-After": "5"})
        except ValueError as e:  # e.g. a prompt longer than the model's context
            return _error(400, str(e))
        rid = f"chatcmpl-{uuid.uuid4().hex[:24]}"
        created = int(time.time())
        if req["stream"]:
            return await self._stream(request, gen, events, req, rid, created, len(ids))
        deadline = loop.time() + self.request_timeout_s
        text = TextStream(self.tok, req["stop"])
        try:
            while True:
                try:
                    ev = await asyncio.wait_for(events.get(), max(0.0, deadline - loop.time()))
                except asyncio.TimeoutError:
                    self.stats["timeouts"] += 1
                    return _error(504, f"not finished in {self.request_timeout_s} s (request_timeout_s)", "timeout")
                if ev["kind"] in ("tokens", "observation") and text.add(ev["ids"], ev["kind"] == "tokens"):
                    self.engine.cancel(gen)  # a stop string: the rest is not wanted
                if ev["kind"] == "done":
                    break
        finally:  # a deadline, a client gone (the handler cancelled): its work stops
            if not gen.done():
                self.engine.cancel(gen)
        if gen.error is not None:
            self.stats["errors"] += 1
            return _error(500, f"generation failed: {type(gen.error).__name__}: {gen.error}", "server_error")
        traj = gen.trajectory()
        finish = "stop" if text.stopped else FINISH.get(traj["finish"], "stop")
        return web.json_response({
            "id": rid, "object": "chat.completion", "created": created, "model": self.model_id,
            "choices": [{"index": 0, "message": {"role": "assistant", "content": text.final()},
                         "finish_reason": finish, "logprobs": None}],
            "usage": self._usage(len(ids), traj), "dart": {**self._extension(traj, text), "seed": req["seed"]}})

    async def _stream(self, request, gen, events, req, rid, created, prompt_len) -> web.StreamResponse:
        resp = web.StreamResponse(headers={"Content-Type": "text/event-stream", "Cache-Control": "no-cache"})
        await resp.prepare(request)
        loop = asyncio.get_running_loop()
        deadline = loop.time() + self.request_timeout_s
        text = TextStream(self.tok, req["stop"])

        def chunk(delta: dict, finish: str | None = None, **extra) -> bytes:
            data = {"id": rid, "object": "chat.completion.chunk", "created": created, "model": self.model_id,
                    "choices": [{"index": 0, "delta": delta, "finish_reason": finish, "logprobs": None}], **extra}
            return f"data: {json.dumps(data)}\n\n".encode()

        try:
            await resp.write(chunk({"role": "assistant", "content": ""}))
            timed_out = False
            while True:
                try:
                    ev = await (events.get() if timed_out else
                                asyncio.wait_for(events.get(), max(0.0, deadline - loop.time())))
                except asyncio.TimeoutError:
                    self.engine.cancel(gen)
                    self.stats["timeouts"] += 1
                    timed_out = True  # the cancelled generation still sends its "done": wait for it
                    continue
                if ev["kind"] in ("tokens", "observation"):
                    if text.add(ev["ids"], ev["kind"] == "tokens"):
                        self.engine.cancel(gen)
                    delta = text.take()
                    if delta:
                        await resp.write(chunk({"content": delta}))
                if ev["kind"] == "done":
                    break
            delta = text.take(final=True)
            if delta:
                await resp.write(chunk({"content": delta}))
            traj = gen.trajectory()
            finish = "stop" if text.stopped else FINISH.get(traj["finish"], "stop")
            ext = {**self._extension(traj, text), "seed": req["seed"]}
            if gen.error is not None:
                ext["error"] = f"{type(gen.error).__name__}: {gen.error}"
            if timed_out:
                ext["error"] = f"not finished in {self.request_timeout_s} s (request_timeout_s)"
            await resp.write(chunk({}, finish, usage=self._usage(prompt_len, traj), dart=ext))
            await resp.write(b"data: [DONE]\n\n")
        finally:  # the client went away (a reset, the handler cancelled): its work stops
            if not gen.done():
                self.engine.cancel(gen)
        return resp

    # -- pieces -------------------------------------------------------------------------------
    def _usage(self, prompt_len: int, traj: dict) -> dict:
        generated = int(sum(traj["mask"]))
        return {"prompt_tokens": prompt_len, "completion_tokens": generated, "total_tokens": prompt_len + generated}

    def _extension(self, traj: dict, text: "TextStream") -> dict:
        routes = route_counts(traj["routes"], traj["mask"], self.route_names)
        proto = self.engine.agent.protocol
        full = text.full
        answer = None
        if proto.answer_open in full and proto.answer_close in full:
            answer = full.rsplit(proto.answer_open, 1)[1].split(proto.answer_close, 1)[0].strip()
        return {"answer": answer, "finish": traj["finish"], "tool_calls": traj["tool_calls"],
                "turns": [{"action": t["action"], "query": t["query"], "observation": t["observation"]}
                          for t in traj["turns"]],
                "routes": routes, "response_tokens": len(traj["ids"])}

    # -- life cycle ---------------------------------------------------------------------------
    def app(self) -> web.Application:
        app = web.Application(client_max_size=self.max_body)
        app.router.add_post("/v1/chat/completions", self.chat)
        app.router.add_get("/v1/models", self.models)
        app.router.add_get("/health", self.health)
        app.router.add_route("*", "/{tail:.*}", self.not_found)
        return app

    async def _serve(self, ready: threading.Event | None = None):
        self._stopped = asyncio.Event()
        runner = web.AppRunner(self.app(), access_log=None, handler_cancellation=True)
        await runner.setup()
        site = web.TCPSite(runner, self.host, self.port, backlog=1024, reuse_address=True)
        await site.start()
        self.port = site._server.sockets[0].getsockname()[1]
        if ready is not None:
            ready.set()
        try:
            await self._stopped.wait()
        finally:
            await runner.shutdown()
            await runner.cleanup()

    @property
    def url(self) -> str:
        return f"http://{self.host}:{self.port}/v1"

    def start(self, timeout_s: float = 60.0) -> "ChatServer":
        """Serve on a background thread (tests, notebooks); the engine steps on its own thread."""
        self.engine.start()
        ready, failed = threading.Event(), []

        def run():
            self._loop = asyncio.new_event_loop()
            try:
                self._loop.run_until_complete(self._serve(ready))
            except BaseException as e:  # noqa: BLE001 — e.g. the port is taken: start() raises it
                failed.append(e)
                ready.set()
            finally:
                self._loop.close()

        self._thread = threading.Thread(target=run, name="chat-server", daemon=True)
        self._thread.start()
        if not ready.wait(timeout_s) or failed:
            raise RuntimeError(f"chat server on {self.host}:{self.port} failed to start"
                               + (f": {type(failed[0]).__name__}: {failed[0]}" if failed else ""))
        return self

    def stop(self):
        if self._loop is not None and self._stopped is not None:
            self._loop.call_soon_threadsafe(self._stopped.set)
        if self._thread is not None:
            self._thread.join(30)
        self.engine.close()

    def serve_forever(self, on_ready=None):
        self.engine.start()

        async def main():
            ready = threading.Event()
            task = asyncio.create_task(self._serve(ready))
            while not ready.is_set() and not task.done():
                await asyncio.sleep(0.01)
            if on_ready is not None and ready.is_set():
                on_ready(self)
            await task
        try:
            asyncio.run(main())
        finally:
            self.engine.close()


class TextStream:
    """The transcript's text as ids arrive: deltas that never split a character (a token may end
    inside a UTF-8 sequence) and a cut at the first stop string."""

    def __init__(self, tokenizer, stops: list[str]):
        self.tok, self.stops = tokenizer, stops
        self.ids: list[int] = []
        self.full = ""
        self.sent = 0
        self.stopped = False
        self._searched = 0  # text before this is observation or already searched for stop strings

    def add(self, ids: list[int], generated: bool = True) -> bool:
        """-> True when a stop string just appeared in generated text (the text is cut before it);
        observation text (`generated` False: a passage, a SQL result) never stops the answer."""
        if self.stopped:
            return False
        start = len(self.full)
        self.ids += ids
        self.full = self.tok.decode(self.ids, skip_special_tokens=True)
        if not generated:
            self._searched = len(self.full)
            return False
        since = max(self._searched, start - max((len(s) for s in self.stops), default=0))
        hits = [self.full.find(s, since) for s in self.stops if self.full.find(s, since) >= 0]
        if hits:
            self.full = self.full[:min(hits)]
            self.stopped = True
        return self.stopped

    def take(self, final: bool = False) -> str:
        """The text not yet sent; held back while it ends in a partial character or could still
        grow into a stop string."""
        end = len(self.full)
        if not final and not self.stopped:
            if self.full.endswith("\ufffd"):
                end -= 1
            for s in self.stops:  # a suffix that may be the start of a stop string waits
                for k in range(min(len(s) - 1, end), 0, -1):
                    if self.full[:end].endswith(s[:k]):
                        end -= k
                        break
        end = max(end, self.sent)
        out = self.full[self.sent:end]
        self.sent = end
        return out

    def final(self) -> str:
        return self.full


def _error(status: int, message: str, kind: str = "invalid_request_error", **headers) -> web.Response:
    return web.json_response({"error": {"message": message, "type": kind, "code": status}}, status=status,
                             headers=headers or None)
