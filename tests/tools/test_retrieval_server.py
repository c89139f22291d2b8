"""The retrieval service on loopback with the real MiniLM encoder and faiss index: Search-R1's
contract, limits answered with a readable reply, slow and hostile clients that stall no one,
concurrent requests batched into one encoder call, 64 clients × 20 requests with zero errors, and a
client that retries through a restart (issue 21 §5)."""

import http.client
import json
import os
import socket
import threading
import time
import urllib.error
import urllib.request
from http.server import BaseHTTPRequestHandler, HTTPServer

import pytest

from dart_jax.bench.retrieval_load import run_load
from dart_jax.data.corpus import read_jsonl
from dart_jax.tools.retrieval import DEFAULT_CORPUS, RetrievalTool, Retriever, ensure_index
from dart_jax.tools.retrieval_server import RemoteRetriever, RetrievalServer, ServerLimits

QA = os.path.join(os.path.dirname(DEFAULT_CORPUS), "..", "qa", "nq_oracle.jsonl")


class CountingSearcher:
    """The real retriever, recording the size of each call (the batching is what is under test)."""

    def __init__(self, inner):
        self.inner, self.calls = inner, []

    def search(self, queries, topk):
        self.calls.append(len(queries))
        return self.inner.search(queries, topk)


@pytest.fixture(scope="module")
def retriever(tmp_path_factory):
    os.environ["DART_JAX_CACHE"] = str(tmp_path_factory.mktemp("cache"))
    return Retriever(ensure_index())


@pytest.fixture()
def serve(retriever):
    servers = []

    def start(limits=ServerLimits(), searcher=None, port=0):
        s = RetrievalServer(searcher or CountingSearcher(retriever), "127.0.0.1", port, limits).start()
        servers.append(s)
        return s

    yield start
    for s in servers:
        s.stop()


def post(url, body: bytes, timeout=30):
    req = urllib.request.Request(url, data=body, headers={"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(req, timeout=timeout) as r:
            return r.status, json.loads(r.read())
    except urllib.error.HTTPError as e:
        return e.code, json.loads(e.read())


def raw(port, data: bytes, timeout=10) -> str:
    """The status line the server answers to `data` sent as is."""
    with socket.create_connection(("127.0.0.1", port), timeout=timeout) as s:
        s.sendall(data)
        return s.recv(4096).decode(errors="replace").split("\r\n")[0]


def test_search_r1_contract(serve, retriever):
    server = serve(ServerLimits(max_batch=4))
    url = server.url
    qs = ["who got the first nobel prize in physics", "capital of france"]
    code, body = post(url, json.dumps({"queries": qs, "topk": 2, "return_scores": True}).encode())
    assert code == 200 and len(body["result"]) == 2 and set(body["result"][0][0]) == {"document", "score"}
    code, body = post(url, json.dumps({"queries": qs, "topk": 2}).encode())
    assert code == 200 and set(body["result"][0][0]) == {"id", "contents"}
    remote = RemoteRetriever(f"http://127.0.0.1:{server.port}")
    local = retriever.search(qs, 3)
    assert [[d["id"] for d, _ in h] for h in remote.search(qs, 3)] == [[d["id"] for d, _ in h] for h in local]
    assert RetrievalTool(remote).batch(qs[:1])[0].startswith("Doc 1(Title: ")
    assert post(url, b"{not json")[0] == 400
    assert post(url, json.dumps({"queries": "x"}).encode())[0] == 400
    assert post(url, json.dumps({"queries": ["x"], "topk": 0}).encode())[0] == 400
    assert post(url, json.dumps({"queries": ["x"] * 5}).encode())[0] == 413
    assert post(url.replace("/retrieve", "/other"), b"{}")[0] == 404
    with urllib.request.urlopen(url.replace("/retrieve", "/health"), timeout=10) as r:
        health = json.loads(r.read())
    assert health["status"] == "ok" and health["queries"] >= 4


def test_limits_answer_after_draining_and_bad_lengths_fail_fast(serve):
    server = serve(ServerLimits(max_body=1 << 20, max_query_chars=1000))
    # an oversized body is read before the 413, so the client reads the reply (no broken pipe)
    conn = http.client.HTTPConnection("127.0.0.1", server.port, timeout=30)
    conn.request("POST", "/retrieve", body=b" " * (5 << 20), headers={"Content-Type": "application/json"})
    resp = conn.getresponse()
    assert resp.status == 413 and "exceeds" in json.loads(resp.read())["error"]
    conn.close()
    code, body = post(server.url, json.dumps({"queries": ["x " * 600_000]}).encode())
    assert code == 413
    code, body = post(server.url, json.dumps({"queries": ["y" * 1001]}).encode())
    assert code == 413 and "1001 characters" in body["error"]
    t = time.monotonic()
    assert raw(server.port, b"POST /retrieve HTTP/1.1\r\nHost: x\r\nContent-Length: -1\r\n\r\n{}").split()[1] == "400"
    assert time.monotonic() - t < 2
    assert raw(server.port, b"POST /retrieve HTTP/1.1\r\nHost: x\r\nContent-Length: abc\r\n\r\n").split()[1] == "400"


def test_a_slow_client_gets_408_and_stalls_no_one(serve):
    server = serve(ServerLimits(body_timeout_s=1.0))
    slow = socket.create_connection(("127.0.0.1", server.port), timeout=10)
    slow.sendall(b"POST /retrieve HTTP/1.1\r\nHost: x\r\nContent-Length: 100\r\n\r\n{\"queries\"")
    t = time.monotonic()
    code, body = post(server.url, json.dumps({"queries": ["capital of france"], "topk": 1}).encode())
    assert code == 200 and time.monotonic() - t < 1.0  # served while the slow body is still pending
    assert slow.recv(4096).decode().startswith("HTTP/1.1 408")
    slow.close()


def test_concurrent_requests_share_encoder_calls_and_get_their_own_results(serve, retriever):
    searcher = CountingSearcher(retriever)
    server = serve(ServerLimits(max_wait_ms=50), searcher)
    questions = [r["question"] for r in read_jsonl(QA)][:16]
    out = [None] * len(questions)

    def one(i):
        out[i] = post(server.url, json.dumps({"queries": [questions[i]], "topk": 1 + i % 3}).encode())

    threads = [threading.Thread(target=one, args=(i,)) for i in range(len(questions))]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert max(searcher.calls) > 1 and len(searcher.calls) < len(questions), searcher.calls
    direct = retriever.search(questions, 3)
    for i, (code, body) in enumerate(out):
        assert code == 200 and len(body["result"][0]) == 1 + i % 3
        assert [d["id"] for d in body["result"][0]] == [d["id"] for d, _ in direct[i][:1 + i % 3]]


def test_64_clients_times_20_requests_with_hostile_clients_zero_errors(serve):
    server = serve()
    questions = [r["question"] for r in read_jsonl(QA)]
    report = run_load(server.url, questions, clients=64, requests=20, hostile=True)
    print(json.dumps(report))
    assert report["requests"] == 1280 and report["errors"] == 0, report
    assert report["hostile"]["1MB query"] == 413 and report["hostile"]["Content-Length -1"].split()[1] == "400"


def test_client_retries_through_a_restart_and_gives_up_at_its_deadline(serve):
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    client = RemoteRetriever(f"http://127.0.0.1:{port}", timeout_s=5, deadline_s=30)
    threading.Timer(0.7, lambda: serve(port=port)).start()  # nothing listens for 0.7 s
    hits = client.search(["capital of france"], 1)
    assert len(hits) == 1 and client.retries >= 1

    calls = []

    class Busy(BaseHTTPRequestHandler):  # a real server answering 503 twice, then a result
        def log_message(self, *args):
            pass

        def do_POST(self):
            self.rfile.read(int(self.headers["Content-Length"]))
            calls.append(1)
            ok = len(calls) > 2
            body = json.dumps({"result": [[{"document": {"id": "1", "contents": "x"}, "score": 1.0}]]}
                              if ok else {"error": "busy"}).encode()
            self.send_response(200 if ok else 503)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

    busy = HTTPServer(("127.0.0.1", 0), Busy)
    threading.Thread(target=busy.serve_forever, daemon=True).start()
    try:
        client = RemoteRetriever(f"http://127.0.0.1:{busy.server_address[1]}", deadline_s=10)
        assert client.search(["q"], 1)[0][0][0]["id"] == "1" and client.retries == 2
    finally:
        busy.shutdown()
        busy.server_close()
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        dead = s.getsockname()[1]
    t = time.monotonic()
    with pytest.raises(RuntimeError, match=r"failed for 1 s .* last error"):
        RemoteRetriever(f"http://127.0.0.1:{dead}", deadline_s=1.0).search(["q"], 1)
    assert time.monotonic() - t < 2.5
    # a client error is not retried
    server = serve(ServerLimits(max_batch=1))
    with pytest.raises(RuntimeError, match="answered 413"):
        RemoteRetriever(server.url, deadline_s=10).search(["a", "b"], 1)


def test_a_failing_searcher_is_a_500_naming_the_error(serve):
    class Broken:
        def search(self, queries, topk):
            raise OSError("index file vanished")

    server = serve(searcher=Broken())
    code, body = post(server.url, json.dumps({"queries": ["q"]}).encode())
    assert code == 500 and "index file vanished" in body["error"]
    with pytest.raises(ValueError, match="max_wait_ms"):
        ServerLimits(max_wait_ms=0)


def test_start_on_a_taken_port_fails_and_stop_answers_requests_in_flight(serve, retriever):
    first = serve()
    with pytest.raises(RuntimeError, match="failed to start"):
        RetrievalServer(CountingSearcher(retriever), "127.0.0.1", first.port).start()

    class Slow:
        def search(self, queries, topk):
            time.sleep(1.5)
            return retriever.search(queries, topk)

    server = RetrievalServer(Slow(), "127.0.0.1", 0, ServerLimits(warm_batch=1)).start()
    out = []
    t = threading.Thread(target=lambda: out.append(post(server.url, json.dumps({"queries": ["q"]}).encode())))
    t.start()
    time.sleep(0.3)  # the request is being searched
    t0 = time.monotonic()
    server.stop()
    t.join(10)
    assert time.monotonic() - t0 < 5 and out and out[0][0] in (200, 500), out
