"""Load on a retrieval server as every rollout process would put it: `clients` threads, each
sending `requests` POST /retrieve calls back to back with raw HTTP (no retries, so every failure
counts), optionally while hostile clients misbehave (a slow body, an oversized query, a bad
Content-Length). Reports errors by kind and latency percentiles. `run_beside_big` measures the other
clients' latency while one big request (many long queries × a large top-k) runs, and the server's RSS."""

from __future__ import annotations

import http.client
import json
import socket
import threading
import time
import urllib.parse

import numpy as np


def _post(host: str, port: int, body: bytes, timeout: float) -> int:
    conn = http.client.HTTPConnection(host, port, timeout=timeout)
    try:
        conn.request("POST", "/retrieve", body=body, headers={"Content-Type": "application/json"})
        resp = conn.getresponse()
        resp.read()
        return resp.status
    finally:
        conn.close()


def _slow_body(host: str, port: int, stop: threading.Event) -> None:
    """Declares a 1 kB body and sends one byte a second."""
    with socket.create_connection((host, port), timeout=60) as s:
        s.sendall(b"POST /retrieve HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                  b"Content-Length: 1024\r\n\r\n")
        while not stop.is_set():
            try:
                s.sendall(b" ")
            except OSError:
                return
            stop.wait(1.0)


def _negative_length(host: str, port: int) -> str:
    with socket.create_connection((host, port), timeout=30) as s:
        s.sendall(b"POST /retrieve HTTP/1.1\r\nHost: x\r\nContent-Length: -1\r\n\r\n{}")
        try:
            return s.recv(200).decode(errors="replace").split("\r\n")[0] or "closed"
        except socket.timeout:
            return "no answer in 30 s"


def run_load(url: str, queries: list[str], clients: int = 64, requests: int = 20, per_request: int = 1,
             topk: int = 3, timeout: float = 60.0, hostile: bool = False) -> dict:
    u = urllib.parse.urlparse(url)
    host, port = u.hostname, u.port
    latencies: list[float] = []
    errors: dict[str, int] = {}
    lock = threading.Lock()
    start = threading.Barrier(clients + 1)

    def client(c: int) -> None:
        start.wait()
        for r in range(requests):
            qs = [queries[(c * requests + r + k) % len(queries)] for k in range(per_request)]
            body = json.dumps({"queries": qs, "topk": topk, "return_scores": True}).encode()
            t = time.perf_counter()
            try:
                code = _post(host, port, body, timeout)
                kind = None if code == 200 else f"HTTP {code}"
            except Exception as e:  # noqa: BLE001 — every failure is counted by kind
                kind = type(e).__name__
            with lock:
                latencies.append(time.perf_counter() - t)
                if kind:
                    errors[kind] = errors.get(kind, 0) + 1

    stop, hostile_out = threading.Event(), {}
    side = []
    if hostile:
        side = [threading.Thread(target=_slow_body, args=(host, port, stop), daemon=True) for _ in range(4)]

        def big():
            t = time.perf_counter()
            try:
                hostile_out["1MB query"] = _post(host, port, json.dumps({"queries": ["x " * 500_000]}).encode(),
                                                 timeout)
            except Exception as e:  # noqa: BLE001
                hostile_out["1MB query"] = type(e).__name__
            hostile_out["1MB query s"] = round(time.perf_counter() - t, 2)

        def neg():
            hostile_out["Content-Length -1"] = _negative_length(host, port)

        side += [threading.Thread(target=big, daemon=True), threading.Thread(target=neg, daemon=True)]
    threads = [threading.Thread(target=client, args=(c,), daemon=True) for c in range(clients)]
    for t in threads + side:
        t.start()
    t0 = time.perf_counter()
    start.wait()
    for t in threads:
        t.join()
    wall = time.perf_counter() - t0
    stop.set()
    for t in side:
        t.join(timeout=35)
    lat = np.asarray(latencies) * 1000
    return {"clients": clients, "requests_per_client": requests, "queries_per_request": per_request,
            "requests": len(latencies), "errors": sum(errors.values()), "errors_by_kind": errors,
            "p50_ms": round(float(np.percentile(lat, 50)), 1), "p95_ms": round(float(np.percentile(lat, 95)), 1),
            "max_ms": round(float(lat.max()), 1), "wall_s": round(wall, 2),
            "requests_per_s": round(len(latencies) / wall, 1), "hostile": hostile_out}


def long_queries(questions: list[str], n: int, chars: int = 4000) -> list[str]:
    """`n` distinct queries of `chars` characters of real words (256 tokens after MiniLM's truncation)."""
    text = " ".join(questions * (1 + n * 100 // max(1, len(" ".join(questions)))))
    return [f"{i} " + text[i * 97:i * 97 + chars - 10] for i in range(n)]


def _rss_mib(pid: int) -> dict:
    with open(f"/proc/{pid}/status") as f:
        st = dict(line.split(":", 1) for line in f)
    return {k: int(st[k].split()[0]) >> 10 for k in ("VmRSS", "VmHWM")}


def run_beside_big(url: str, questions: list[str], big: list[str], big_topk: int, clients: int = 4,
                   timeout: float = 120.0, pid: int | None = None) -> dict:
    """`clients` threads send one-question requests back to back while one request of `big` queries
    (top-`big_topk`) runs; their latencies, the big request's status and time, and the server's
    resident memory (`pid`, default this process) before and after."""
    import os

    u = urllib.parse.urlparse(url)
    host, port, pid = u.hostname, u.port, pid or os.getpid()
    lat, codes, out, done = [], {}, {}, threading.Event()
    rss0 = _rss_mib(pid)

    def maximal() -> None:
        t = time.perf_counter()
        try:
            out["status"] = _post(host, port, json.dumps({"queries": big, "topk": big_topk}).encode(), timeout)
        except Exception as e:  # noqa: BLE001
            out["status"] = type(e).__name__
        out["s"] = round(time.perf_counter() - t, 2)
        done.set()

    def client(c: int) -> None:
        i = 0
        while not done.is_set():
            body = json.dumps({"queries": [questions[(c * 997 + i) % len(questions)]], "topk": 3}).encode()
            t = time.perf_counter()
            try:
                code = _post(host, port, body, timeout)
            except Exception as e:  # noqa: BLE001
                code = type(e).__name__
            lat.append(time.perf_counter() - t)
            codes[code] = codes.get(code, 0) + 1
            i += 1

    threads = [threading.Thread(target=maximal)] + [threading.Thread(target=client, args=(c,)) for c in range(clients)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    ms = np.asarray(lat) * 1000
    return {"big_request": f"{len(big)} queries × top-{big_topk}", "big_status": out["status"], "big_s": out["s"],
            "others": len(lat), "others_status": codes, "others_p50_ms": round(float(np.percentile(ms, 50)), 1),
            "others_p95_ms": round(float(np.percentile(ms, 95)), 1), "others_max_ms": round(float(ms.max()), 1),
            "rss_mib_before": rss0["VmRSS"], "rss_mib_after": _rss_mib(pid)["VmRSS"],
            "peak_rss_mib": _rss_mib(pid)["VmHWM"]}


def bench_retrieval(url: str | None = None, clients: int = 64, requests: int = 20, hostile: bool = True) -> dict:
    """`run_load` with 1,000 NQ test questions against `url`, or against our service started on
    loopback over the embedded index (`launch.bench retrieval`), then for ours `run_beside_big` with
    a request past the work bound (512 × 4,000 characters × top-100) and a maximal admitted one."""
    from dart_jax.data.corpus import read_jsonl
    from dart_jax.data.paths import repo_path

    questions = [r["question"] for r in read_jsonl(repo_path("data/qa/nq_test_sample1000.jsonl"))]
    server = None
    if not url:
        from dart_jax.tools.retrieval import Retriever, ensure_index
        from dart_jax.tools.retrieval_server import RetrievalServer
        server = RetrievalServer(Retriever(ensure_index()), "127.0.0.1", 0).start()
        url = server.url
    try:
        res = run_load(url, questions, clients=clients, requests=requests, hostile=hostile)
        if server is not None:  # one request past the work bound, then the largest one within it (63 × 256 tokens)
            res["past_the_work_bound"] = run_beside_big(url, questions, long_queries(questions, 512), 100)
            res["maximal_request"] = run_beside_big(url, questions, long_queries(questions, 63), 50)
    finally:
        if server is not None:
            server.stop()
    return dict(res, url=url)
