"""Issue 49 §8-9 over real HTTP on loopback, with the real MiniLM encoder and faiss index: a request
that cannot be encoded (a lone surrogate) is a 400 for that request only while the requests batched
with it are served their own results; a search failure that validation does not foresee reaches only
the request that causes it; nesting bombs, integers past Python's digit limit and bodies that claim
gzip / deflate but are not are 400 with a one-line reason, never 500, and the server serves on."""

import http.client
import json
import os
import threading
import zlib

import pytest

from dart_jax.data.corpus import read_jsonl
from dart_jax.tools.retrieval import DEFAULT_CORPUS, Retriever, ensure_index
from dart_jax.tools.retrieval_server import RetrievalServer, ServerLimits

QA = os.path.join(os.path.dirname(DEFAULT_CORPUS), "..", "qa", "nq_oracle.jsonl")


class CountingSearcher:
    """The real retriever, recording each call's queries; `fail_on` makes a call holding that
    text raise (a per-query failure that request validation does not catch)."""

    def __init__(self, inner, fail_on=None):
        self.inner, self.fail_on, self.calls = inner, fail_on, []

    def search(self, queries, topk):
        self.calls.append(list(queries))
        if self.fail_on is not None and any(self.fail_on in q for q in queries):
            raise ValueError(f"cannot encode a query holding {self.fail_on!r}")
        return self.inner.search(queries, topk)


@pytest.fixture(scope="module")
def retriever(tmp_path_factory):
    os.environ["DART_JAX_CACHE"] = str(tmp_path_factory.mktemp("cache"))
    return Retriever(ensure_index())


@pytest.fixture()
def serve(retriever):
    servers = []

    def start(limits=ServerLimits(warm_batch=1), searcher=None):
        s = RetrievalServer(searcher or CountingSearcher(retriever), "127.0.0.1", 0, limits).start()
        servers.append(s)
        return s

    yield start
    for s in servers:
        s.stop()


def send(port, body: bytes, headers=None, timeout=60):
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=timeout)
    try:
        conn.request("POST", "/retrieve", body=body, headers={"Content-Type": "application/json", **(headers or {})})
        resp = conn.getresponse()
        return resp.status, json.loads(resp.read())
    finally:
        conn.close()


def concurrently(port, bodies: list[bytes]) -> list:
    out = [None] * len(bodies)
    go = threading.Barrier(len(bodies))

    def one(i):
        go.wait()
        out[i] = send(port, bodies[i])

    threads = [threading.Thread(target=one, args=(i,)) for i in range(len(bodies))]
    for t in threads:
        t.start()
    for t in threads:
        t.join(120)
    return out


def ids(rows):
    return [[(d["document"] if "document" in d else d)["id"] for d in row] for row in rows]


def test_a_lone_surrogate_is_a_400_for_its_request_only(serve, retriever):
    with pytest.raises(Exception):  # the encoder cannot take it: without validation the batch fails
        retriever.search(["capital of france \ud800"], 1)
    searcher = CountingSearcher(retriever)
    # a 1 s window for company: the 11 requests leave together (a barrier), so they share a batch even on a
    # loaded host; were the poisoned one alone anyway, it must fail alone (below)
    server = serve(ServerLimits(warm_batch=1, max_wait_ms=1000), searcher)
    questions = [r["question"] for r in read_jsonl(QA)][:12]
    poison = json.dumps({"queries": ["fine", "who wrote hamlet \ud800 please"], "topk": 2}).encode()
    assert b"\\ud800" in poison  # valid JSON: the surrogate is an escape
    bodies = [poison] + [json.dumps({"queries": [q], "topk": 2}).encode() for q in questions]
    out = concurrently(server.port, bodies)
    code, body = out[0]
    assert code == 400 and "query 1 is not valid Unicode" in body["error"] and "\\ud800" in body["error"], out[0]
    assert "\n" not in body["error"]
    assert max(len(c) for c in searcher.calls) > 1  # the innocent requests were batched
    alone = [retriever.search([q], 2) for q in questions]
    for q, (code, body), hits in zip(questions, out[1:], alone):
        assert code == 200, (q, code, body)
        assert ids(body["result"]) == [[d["id"] for d, _ in row] for row in hits]
    # the same request alone, twice in a row: a 400 each time, and the server serves on
    assert send(server.port, poison)[0] == 400
    assert send(server.port, poison)[0] == 400
    code, body = send(server.port, json.dumps({"queries": [questions[0]], "topk": 2}).encode())
    assert code == 200 and ids(body["result"]) == [[d["id"] for d, _ in alone[0][0]]]


def test_an_unforeseen_search_failure_reaches_only_its_request(serve, retriever):
    searcher = CountingSearcher(retriever, fail_on="POISON")
    # a 1 s window for company: the 11 requests leave together (a barrier), so they share a batch even on a
    # loaded host; were the poisoned one alone anyway, it must fail alone (below)
    server = serve(ServerLimits(warm_batch=1, max_wait_ms=1000), searcher)
    questions = [r["question"] for r in read_jsonl(QA)][:10]
    bodies = [json.dumps({"queries": [q], "topk": 1 + i % 3}).encode() for i, q in enumerate(questions)]
    bodies.insert(4, json.dumps({"queries": ["a POISON query"], "topk": 1}).encode())
    out = concurrently(server.port, bodies)
    code, body = out.pop(4)
    assert code == 500 and "cannot encode a query holding 'POISON'" in body["error"], (code, body)
    failed = [c for c in searcher.calls if any("POISON" in q for q in c)]
    assert failed[-1] == ["a POISON query"], searcher.calls  # isolated in the end ...
    assert len(failed[0]) > 1 or failed == [["a POISON query"]], searcher.calls  # ... after its batch failed
    for i, (q, (code, body)) in enumerate(zip(questions, out)):
        assert code == 200, (q, code, body)
        assert ids(body["result"]) == [[d["id"] for d, _ in row] for row in retriever.search([q], 1 + i % 3)]


CASES = [
    ("nesting bomb", b"[" * 100_000 + b"]" * 100_000, {}, "nested too deeply"),
    ("nesting bomb in a field", b'{"queries": ["x"], "extra": ' + b"[" * 100_000 + b"]" * 100_000 + b"}", {},
     "nested too deeply"),
    ("dict nesting bomb", b'{"a":' * 50_000 + b"1" + b"}" * 50_000, {}, "nested too deeply"),
    ("digit limit", b'{"queries": ["x"], "topk": 1' + b"0" * 5000 + b"}", {}, "digits"),
    ("digit limit, negative", b'{"queries": ["x"], "topk": -' + b"9" * 5000 + b"}", {}, "digits"),
    ("not gzip", b'{"queries": ["capital of france"]}', {"Content-Encoding": "gzip"}, "content-encoding: gzip"),
    ("not gzip, 1 MiB", b"x" * (1 << 20), {"Content-Encoding": "gzip"}, "content-encoding: gzip"),
    ("not deflate", b'{"queries": ["capital of france"]}', {"Content-Encoding": "deflate"},
     "content-encoding: deflate"),
    ("truncated gzip", zlib.compress(b'{"queries": ["capital of france"]}' * 50, wbits=31)[:40],
     {"Content-Encoding": "gzip"}, ""),
    ("invalid UTF-8", b'{"queries": ["\xff\xfe"]}', {}, "invalid JSON"),
]


@pytest.mark.parametrize("name,body,headers,reason", CASES, ids=[c[0] for c in CASES])
def test_malformed_bodies_are_400_with_a_one_line_reason(serve, name, body, headers, reason):
    server = serve()
    code, reply = send(server.port, body, headers)
    assert code == 400, (name, code, reply)
    assert reason.lower() in reply["error"].lower() and "\n" not in reply["error"], (name, reply)
    assert "Traceback" not in reply["error"] and "400, message" not in reply["error"] and len(reply["error"]) < 300
    # the server serves on, and a real gzip body is read
    good = json.dumps({"queries": ["capital of france"], "topk": 1}).encode()
    assert send(server.port, good)[0] == 200
    assert send(server.port, zlib.compress(good, wbits=31), {"Content-Encoding": "gzip"})[0] == 200
