"""Search-R1-compatible retrieval over HTTP (Search-R1's retrieval-server contract), both directions.

    POST /retrieve {"queries": [str], "topk": int, "return_scores": bool}
      -> {"result": [[{"document": {"id", "contents"}, "score": float}, …], …]}
         (bare document dicts when return_scores is false)
    GET /health -> {"status": "ok", "pending": …, "batches": …, "queries": …}

`RetrievalServer` is a shared service for every rollout process (aiohttp): concurrent requests
wait in a bounded queue and are served by one encoder + index call per batch (at most
`batch_queries` queries, waiting at most `max_wait_ms` for company), so no request holds a lock
while others queue behind it. Bodies are read with a deadline (a slow client gets 408 and stalls
no one), oversized bodies / batches / queries get 413 after the body is drained (the client reads
the reply instead of a broken pipe), malformed bodies 400 with a one-line reason (invalid JSON, nesting
too deep, numbers past Python's digit limit, a body that does not decode as its Content-Encoding, a
query that is not valid Unicode, e.g. a lone surrogate), a full queue 503, a request not served in
`request_timeout_s` 504, unknown paths 404. One request cannot fail its batch: a batch whose search
fails is split in halves and searched again until the failing request is alone; only it gets the 500.
It binds to loopback by default with a listen backlog of 1024.

Work is bounded per request and shared fairly (hardening): a request's work — its queries' encoder
tokens as the encoder pads them (a power of two ≥ 16, capped at its max length) plus its passages
(queries × top-k) / 16 — above `max_work` is refused up front with 413 naming the figures. Admitted
requests are cut into pieces (queries sorted by length, so a piece pads little) and a batch takes at
most one piece from each request, round-robin, up to `batch_tokens` padded token slots: a small
request waits behind at most one piece of a big one. Between pieces, a request whose client got its
504 or went away is dropped with its partial results: no piece starts after the 504 (the one
already encoding finishes).

`RemoteRetriever` speaks the same contract (to this server or an existing Search-R1 one) and
retries connection errors and 502/503/504 with exponential backoff until its deadline.
"""

from __future__ import annotations

import asyncio
import collections
import copy
import dataclasses
import http.client
import json
import logging
import random
import threading
import time
import urllib.error
import urllib.request
from concurrent.futures import ThreadPoolExecutor

from aiohttp import web
from aiohttp.http_exceptions import HttpProcessingError

from dart_jax.tools.retrieval import Searcher

log = logging.getLogger(__name__)


@dataclasses.dataclass(frozen=True)
class ServerLimits:
    max_batch: int = 512            # queries in one request
    max_topk: int = 100
    max_query_chars: int = 4096     # characters in one query (the encoder reads 256 tokens anyway)
    max_body: int = 4 << 20         # bytes in one request body
    drain_limit: int = 64 << 20     # an oversized body is read and discarded up to this, then the connection closes
    batch_queries: int = 256        # queries per encoder call
    max_wait_ms: float = 5.0        # how long a batch waits for more requests
    queue_size: int = 4096          # requests waiting for the encoder; 503 beyond
    request_timeout_s: float = 60.0  # a request not served by then gets 504
    body_timeout_s: float = 10.0    # a body that has not arrived by then gets 408
    backlog: int = 1024             # listen backlog (the kernel caps it at net.core.somaxconn)
    warm_batch: int = 64            # warm-up compiles batches of up to this many queries before serving
    max_work: int = 16384           # a request's work: Σ query tokens + queries × top-k / PASSAGES_PER_UNIT; 413 beyond
    batch_tokens: int = 2048        # padded token slots (rows × length, the encoder's buckets) in one encoder call

    def __post_init__(self):
        for f in dataclasses.fields(self):
            if getattr(self, f.name) <= 0:
                raise ValueError(f"ServerLimits.{f.name}={getattr(self, f.name)} must be > 0")


PASSAGES_PER_UNIT = 16  # a passage read and rendered costs ~8 µs, a padded token slot encoded ~300 µs (2 CPU cores)


class _TooLarge(Exception):
    pass


@dataclasses.dataclass(eq=False)
class _Pending:
    """An admitted request: its queries are served in pieces, shortest first; `rows` fills in by index."""
    queries: list[str]
    topk: int
    future: asyncio.Future
    tokens: list[int] = dataclasses.field(default_factory=list)  # encoder tokens of each query
    deadline: float = float("inf")                                # loop time of its 504
    order: list[int] = dataclasses.field(default_factory=list)   # query indices, fewest tokens first
    served: int = 0                                               # queries of `order` taken into pieces
    done: int = 0                                                 # queries answered
    rows: list = dataclasses.field(default_factory=list)

    def __post_init__(self):
        self.tokens = self.tokens or [1] * len(self.queries)
        self.order = sorted(range(len(self.queries)), key=self.tokens.__getitem__)
        self.rows = [None] * len(self.queries)


@dataclasses.dataclass(eq=False)
class _Piece:
    pending: _Pending
    idx: list[int]  # indices into pending.queries

    @property
    def queries(self) -> list[str]:
        return [self.pending.queries[i] for i in self.idx]

    @property
    def future(self) -> asyncio.Future:
        return self.pending.future


def _padded(rows: int, longest: int, max_len: int) -> int:
    """Token slots the encoder computes for `rows` queries of at most `longest` tokens: it pads rows to
    8 or a multiple of 64 and lengths to a power of two ≥ 16 (mirrors `Encoder.encode`'s buckets)."""
    return (8 if rows <= 8 else 64 * -(-rows // 64)) * _length(longest, max_len)


def _length(tokens: int, max_len: int) -> int:
    return min(max_len, max(16, 1 << max(0, tokens - 1).bit_length()))


def _token_counter(searcher: Searcher):
    """(max_len, count): the encoder's token count of each query, as `Encoder.encode` tokenizes it
    (prefix, truncation), with a private copy of its tokenizer (the search thread's own is not shared
    across threads); a searcher without a local encoder is counted by characters, an upper bound."""
    enc = getattr(searcher, "encoder", None)
    tok = getattr(enc, "tokenizer", None)
    max_len = int(getattr(enc, "max_length", 256))
    if tok is None:
        return max_len, lambda qs: [min(len(q) + 2, max_len) for q in qs]
    tok, prefix = copy.deepcopy(tok), getattr(enc, "query_prefix", "") or ""

    def tokens(texts: list[str]) -> list[int]:
        return [len(ids) for ids in tok([prefix + t for t in texts], truncation=True, max_length=max_len)["input_ids"]]

    def count(qs: list[str]) -> list[int]:
        """Each query's first 8 characters a token are counted first (the tokenizer reads the whole text
        before truncating); only one that falls short of `max_len` there is counted in full."""
        cut = 8 * max_len
        n = tokens([q[:cut] for q in qs])
        short = [i for i, q in enumerate(qs) if len(q) > cut and n[i] < max_len]
        for i, m in zip(short, tokens([qs[i] for i in short]) if short else []):
            n[i] = m
        return n
    return max_len, count


def _bad_query(queries: list[str]) -> str | None:
    """Why a query cannot be encoded (text that is not valid Unicode: a lone surrogate), or None."""
    for i, q in enumerate(queries):
        try:
            q.encode("utf-8")
        except UnicodeEncodeError as e:
            return (f"query {i} is not valid Unicode: {q[e.start:e.end]!a} at character {e.start} "
                    f"(lone surrogates cannot be encoded)")
    return None


def _error(code: int, message: str, **headers) -> web.Response:
    return web.json_response({"error": message}, status=code, headers=headers or None)


class RetrievalServer:
    """`start()` serves from a background thread (tests, benchmarks, one process that also trains);
    `serve_forever()` blocks (launch.serve_retriever)."""

    def __init__(self, searcher: Searcher, host: str = "127.0.0.1", port: int = 8000,
                 limits: ServerLimits = ServerLimits()):
        self.searcher, self.host, self.port, self.limits = searcher, host, port, limits
        self.stats = {"batches": 0, "queries": 0, "requests": 0, "rejected": 0, "abandoned": 0,
                      "abandoned_queries": 0}
        self._executor = ThreadPoolExecutor(1, thread_name_prefix="retrieval-search")  # the encoder is not re-entrant
        self._count_executor = ThreadPoolExecutor(1, thread_name_prefix="retrieval-count")  # owns the tokenizer copy
        self._max_len, self._count = _token_counter(searcher)
        self._count_here = _token_counter(searcher)[1]  # its own tokenizer copy, for the event loop thread
        self._loop: asyncio.AbstractEventLoop | None = None
        self._thread: threading.Thread | None = None
        self._stopped: asyncio.Event | None = None

    # -- HTTP ---------------------------------------------------------------------------------------
    async def _body(self, request: web.BaseRequest) -> bytes:
        """The body, or _TooLarge after draining it (up to drain_limit)."""
        lim = self.limits
        declared = request.content_length
        if declared is not None and declared > lim.drain_limit:
            raise _TooLarge(f"body of {declared} bytes exceeds {lim.max_body}")
        chunks, size = [], 0
        while True:
            chunk = await request.content.read(1 << 16)
            if not chunk:
                break
            size += len(chunk)
            if size <= lim.max_body:
                chunks.append(chunk)
            elif size > lim.drain_limit:
                break
        if size > lim.max_body:
            raise _TooLarge(f"body of {declared if declared is not None else size} bytes exceeds {lim.max_body}")
        return b"".join(chunks)

    async def retrieve(self, request: web.Request) -> web.Response:
        lim = self.limits
        self.stats["requests"] += 1
        try:
            async with asyncio.timeout(lim.body_timeout_s):
                raw = await self._body(request)
        except TimeoutError:
            self.stats["rejected"] += 1
            return _error(408, f"the request body did not arrive within {lim.body_timeout_s} s", Connection="close")
        except _TooLarge as e:
            self.stats["rejected"] += 1
            drained = request.content.at_eof()
            return _error(413, str(e), **({} if drained else {"Connection": "close"}))
        except (web.RequestPayloadError, HttpProcessingError) as e:  # e.g. "gzip" that is not gzip
            self.stats["rejected"] += 1
            cause = e.__cause__ if isinstance(e.__cause__, HttpProcessingError) else e
            reason = " ".join(str(getattr(cause, "message", None) or e).split())
            reply = _error(400, f"the body could not be read: {reason}", Connection="close")
            await reply.prepare(request)
            await reply.write_eof()
            force_close = getattr(request.protocol, "force_close", None)
            if force_close is not None:  # the rest of a body that does not decode is not read
                force_close()
            return reply
        try:
            req = json.loads(raw or b"null")
        except RecursionError:  # a nesting bomb ([[[[…]]]]) stops at the interpreter's recursion limit
            return _error(400, "invalid JSON: nested too deeply")
        except ValueError as e:  # JSONDecodeError, UnicodeDecodeError, an integer past Python's digit limit
            return _error(400, "invalid JSON: " + " ".join(str(e).split(";")[0].split()))
        if not isinstance(req, dict) or not isinstance(req.get("queries"), list) \
                or not all(isinstance(q, str) for q in req["queries"]):
            return _error(400, "field 'queries' must be a list of strings")
        topk = req.get("topk", 3)
        if not isinstance(topk, int) or isinstance(topk, bool) or not 1 <= topk <= lim.max_topk:
            return _error(400, f"field 'topk' must be an integer in [1, {lim.max_topk}]")
        queries = req["queries"]
        if len(queries) > lim.max_batch:
            return _error(413, f"{len(queries)} queries exceed the batch limit {lim.max_batch}")
        longest = max((len(q) for q in queries), default=0)
        if longest > lim.max_query_chars:
            return _error(413, f"a query of {longest} characters exceeds the limit {lim.max_query_chars}")
        bad = _bad_query(queries)
        if bad is not None:
            return _error(400, bad)
        if not queries:
            return web.json_response({"result": []})
        loop = asyncio.get_running_loop()
        try:
            if sum(map(len, queries)) <= 2048:  # a few short queries are counted at once, on the event loop
                tokens = self._count_here(queries)
            else:
                tokens = await loop.run_in_executor(self._count_executor, self._count, queries)
        except Exception as e:  # noqa: BLE001 — a query the tokenizer cannot take is counted by characters
            log.warning("counting query tokens failed (%s: %s); counting characters", type(e).__name__, e)
            tokens = [min(len(q) + 2, self._max_len) for q in queries]
        slots = sum(_length(t, self._max_len) for t in tokens)  # what the encoder computes: padded lengths
        work = slots + -(-len(queries) * topk // PASSAGES_PER_UNIT)
        if work > lim.max_work:
            self.stats["rejected"] += 1
            return _error(413, f"the request's work {work} (padded query tokens {slots} + {len(queries)} queries × "
                               f"top-{topk} / {PASSAGES_PER_UNIT}) exceeds the limit {lim.max_work}; "
                               f"send fewer, shorter queries or a smaller topk per request")
        pending = _Pending(queries, topk, loop.create_future(), tokens, loop.time() + lim.request_timeout_s)
        try:
            if self._queue.qsize() + len(self._active) >= lim.queue_size:
                raise asyncio.QueueFull
            self._queue.put_nowait(pending)
        except asyncio.QueueFull:
            self.stats["rejected"] += 1
            return _error(503, f"{lim.queue_size} requests are already waiting; retry later", **{"Retry-After": "1"})
        try:
            hits = await asyncio.wait_for(asyncio.shield(pending.future), lim.request_timeout_s)
        except TimeoutError:
            pending.future.cancel()
            return _error(504, f"not served within {lim.request_timeout_s} s")
        except asyncio.CancelledError:  # the client went away: its queued work is dropped, not computed
            pending.future.cancel()
            raise
        except Exception as e:  # noqa: BLE001 — the searcher's failure, reported to this request
            return _error(500, f"search failed: {type(e).__name__}: {e}")
        scores = req.get("return_scores", False)

        def render() -> bytes:
            result = [[{"document": d, "score": s} if scores else d for d, s in row] for row in hits]
            return json.dumps({"result": result}).encode()

        # a large reply (512 queries × top-100) is serialised off the event loop, which serves everyone
        big = len(queries) * topk > 256
        body = await asyncio.get_running_loop().run_in_executor(None, render) if big else render()
        return web.Response(body=body, content_type="application/json")

    async def health(self, request: web.Request) -> web.Response:
        return web.json_response({"status": "ok", "pending": self._queue.qsize() + len(self._active), **self.stats})

    async def not_found(self, request: web.Request) -> web.Response:
        return _error(404, f"unknown path {request.method} {request.path}; use POST /retrieve")

    # -- batching -----------------------------------------------------------------------------------
    def _drop_abandoned(self, now: float) -> None:
        """Requests whose client got its 504 or went away leave the round, with their partial results."""
        keep = collections.deque()
        for p in self._active:
            if p.future.done() or now >= p.deadline:
                self.stats["abandoned"] += 1
                self.stats["abandoned_queries"] += len(p.queries) - p.served
            else:
                keep.append(p)
        self._active = keep

    def _next_batch(self) -> list[_Piece]:
        """One piece from each request in round-robin order, while the batch's padded token slots stay
        within `batch_tokens` (and its passages within `batch_tokens` work units) and no query would pad
        the batch to more than twice the first query's length; the first query always goes. Requests
        that gave a piece and have more move to the back of the round, behind those that arrive meanwhile."""
        budget, rows, longest, passages, first = self.limits.batch_tokens, 0, 0, 0, 0
        pieces, served = [], []
        for p in list(self._active):
            idx = []
            while p.served + len(idx) < len(p.queries):
                i = p.order[p.served + len(idx)]
                slots = _padded(rows + 1, max(longest, p.tokens[i]), self._max_len)
                if rows and (slots > budget or rows >= self.limits.batch_queries
                             or (passages + p.topk) > budget * PASSAGES_PER_UNIT
                             or _length(p.tokens[i], self._max_len) > 2 * first):  # no short query padded long
                    break
                first = first or _length(p.tokens[i], self._max_len)
                idx.append(i)
                rows, longest, passages = rows + 1, max(longest, p.tokens[i]), passages + p.topk
            if idx:
                p.served += len(idx)
                pieces.append(_Piece(p, idx))
                served.append(p)
        gave = {id(p) for p in served}
        rest = [p for p in self._active if id(p) not in gave]
        self._active = collections.deque(rest + [p for p in served if p.served < len(p.queries)])
        self._newcomers_at = len(rest)  # arrivals go ahead of the requests this batch served
        return pieces

    async def _batcher(self) -> None:
        lim, loop = self.limits, asyncio.get_running_loop()
        while True:
            if not self._active:
                self._newcomers_at = 0
                self._active.append(await self._queue.get())
                until = loop.time() + lim.max_wait_ms / 1000
                while loop.time() < until:  # a moment for company
                    try:
                        self._active.append(await asyncio.wait_for(self._queue.get(), until - loop.time()))
                    except TimeoutError:
                        break
            while not self._queue.empty():
                self._active.insert(min(self._newcomers_at, len(self._active)), self._queue.get_nowait())
                self._newcomers_at += 1
            self._drop_abandoned(loop.time())
            batch = self._next_batch()
            self._inflight = [piece.pending for piece in batch]
            if batch:
                await self._search(batch)

    async def _search(self, batch: list[_Piece]) -> None:
        """One encoder + index call for the batch. If it fails, the halves are searched apart (again
        halving those that fail), so the error reaches only the request that causes it when alone;
        k failing requests among n cost about 2k·log2(n) extra calls, none when nothing fails."""
        batch = [p for p in batch if not p.future.done()]
        if not batch:
            return
        queries = [q for p in batch for q in p.queries]
        topk = max(p.pending.topk for p in batch)
        try:
            hits = await asyncio.get_running_loop().run_in_executor(self._executor, self.searcher.search,
                                                                    queries, topk)
        except Exception as e:  # noqa: BLE001 — alone, the request gets the error; in company, it is isolated
            if len(batch) == 1:
                if not batch[0].future.done():
                    batch[0].future.set_exception(e)
                return
            log.warning("a search of %d requests failed (%s: %s); searching them apart", len(batch),
                        type(e).__name__, e)
            half = len(batch) // 2
            await self._search(batch[:half])
            await self._search(batch[half:])
            return
        self.stats["batches"] += 1
        self.stats["queries"] += len(queries)
        start = 0
        for piece in batch:
            p = piece.pending
            for i, row in zip(piece.idx, hits[start:start + len(piece.idx)]):
                p.rows[i] = row[:p.topk]
            start += len(piece.idx)
            p.done += len(piece.idx)
            if p.done == len(p.queries) and not p.future.done():
                p.future.set_result(p.rows)

    # -- life cycle ---------------------------------------------------------------------------------
    def _warm_up(self) -> None:
        """Searches of 1 and `warm_batch` questions of short and medium length: the shapes the
        encoder's buckets give most batches (rows 8 or 64, tokens 16 or 32), compiled before serving."""
        for n in sorted({1, self.limits.warm_batch}):
            for words in (4, 20):
                self.searcher.search(["warm up " * (words // 2)] * n, 1)
        self.searcher.search(["warm up " * self._max_len], 1)  # a piece of the longest queries (8 rows)

    async def _serve(self, ready: threading.Event | None = None) -> None:
        self._queue: asyncio.Queue[_Pending] = asyncio.Queue(self.limits.queue_size)
        self._active: collections.deque[_Pending] = collections.deque()  # admitted, in round-robin order
        self._inflight: list[_Pending] = []
        self._newcomers_at = 0
        try:  # compile the encoder's common query shapes now, not on a client's clock
            await asyncio.get_running_loop().run_in_executor(self._executor, self._warm_up)
        except Exception as e:  # noqa: BLE001 — a broken searcher still serves its errors as 500s
            log.warning("retrieval warm-up search failed: %s: %s", type(e).__name__, e)
        self._stopped = asyncio.Event()
        app = web.Application(client_max_size=self.limits.max_body)
        app.router.add_post("/retrieve", self.retrieve)
        app.router.add_get("/health", self.health)
        app.router.add_route("*", "/{tail:.*}", self.not_found)
        runner = web.AppRunner(app, access_log=None, handler_cancellation=True)
        await runner.setup()
        site = web.TCPSite(runner, self.host, self.port, backlog=self.limits.backlog, reuse_address=True)
        await site.start()
        self.port = site._server.sockets[0].getsockname()[1]
        batcher = asyncio.create_task(self._batcher())
        if ready is not None:
            ready.set()
        try:
            await self._stopped.wait()
        finally:
            batcher.cancel()
            waiting = list(self._inflight) + list(self._active)
            while not self._queue.empty():
                waiting.append(self._queue.get_nowait())
            for p in waiting:  # requests in flight or queued get an answer (500), not a hang
                if not p.future.done():
                    p.future.set_exception(RuntimeError("the retrieval server is stopping"))
            await runner.shutdown()
            await runner.cleanup()

    @property
    def url(self) -> str:
        return f"http://{self.host}:{self.port}/retrieve"

    def start(self, timeout_s: float = 300.0) -> RetrievalServer:
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

        self._thread = threading.Thread(target=run, name="retrieval-server", daemon=True)
        self._thread.start()
        if not ready.wait(timeout_s):
            raise RuntimeError(f"retrieval server on {self.host}:{self.port} did not start in {timeout_s} s")
        if failed:
            raise RuntimeError(f"retrieval server on {self.host}:{self.port} failed to start: "
                               f"{type(failed[0]).__name__}: {failed[0]}") from failed[0]
        return self

    def stop(self) -> None:
        if self._loop is not None and self._stopped is not None:
            self._loop.call_soon_threadsafe(self._stopped.set)
        if self._thread is not None:
            self._thread.join(30)
        self._executor.shutdown(wait=False)
        self._count_executor.shutdown(wait=False)

    def serve_forever(self, on_ready=None) -> None:
        async def main():
            ready = threading.Event()
            task = asyncio.create_task(self._serve(ready))
            while not ready.is_set() and not task.done():
                await asyncio.sleep(0.01)
            if on_ready is not None and ready.is_set():
                on_ready(self)
            await task
        asyncio.run(main())


class RemoteRetriever:
    """Client of a Search-R1 retrieval server; same `search` interface as `Retriever`.

    Connection errors (refused, reset, timed out) and 502 / 503 / 504 are retried with exponential
    backoff (50 ms doubling to 2 s, with jitter) until `deadline_s` after the call began; any other
    HTTP error fails at once with the server's message."""

    RETRY_STATUS = (502, 503, 504)

    def __init__(self, url: str, timeout_s: float = 60.0, deadline_s: float = 300.0):
        self.url = url.rstrip("/") + ("" if url.rstrip("/").endswith("/retrieve") else "/retrieve")
        self.timeout_s, self.deadline_s = timeout_s, deadline_s
        self.retries = 0

    def _post(self, body: bytes, timeout: float) -> dict:
        req = urllib.request.Request(self.url, data=body, headers={"Content-Type": "application/json"})
        with urllib.request.urlopen(req, timeout=timeout) as resp:
            return json.loads(resp.read())

    def search(self, queries: list[str], topk: int = 3) -> list[list[tuple[dict, float]]]:
        if not queries:
            return []
        body = json.dumps({"queries": list(queries), "topk": topk, "return_scores": True}).encode()
        deadline = time.monotonic() + self.deadline_s
        delay = 0.05
        while True:
            left = deadline - time.monotonic()
            try:
                payload = self._post(body, max(0.1, min(self.timeout_s, left)))
                break
            except urllib.error.HTTPError as e:
                detail = e.read().decode(errors="replace")
                if e.code not in self.RETRY_STATUS:
                    raise RuntimeError(f"retriever {self.url} answered {e.code}: {detail}") from None
                failure = f"HTTP {e.code}: {detail}"
            except (urllib.error.URLError, ConnectionError, TimeoutError, http.client.HTTPException, OSError) as e:
                failure = f"{type(e).__name__}: {getattr(e, 'reason', e)}"
            pause = delay * (0.5 + random.random())
            if time.monotonic() + pause >= deadline:
                raise RuntimeError(f"retriever {self.url} failed for {self.deadline_s:.0f} s "
                                   f"({self.retries} retries); last error {failure}")
            self.retries += 1
            time.sleep(pause)
            delay = min(2 * delay, 2.0)
        result = payload.get("result") if isinstance(payload, dict) else None
        if not isinstance(result, list) or len(result) != len(queries):
            raise RuntimeError(f"retriever {self.url} returned {type(result).__name__} for {len(queries)} queries")
        return [[(r["document"], float(r.get("score", 0.0))) if "document" in r else (r, 0.0) for r in row]
                for row in result]
