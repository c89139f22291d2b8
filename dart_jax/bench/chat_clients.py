"""The client side of `launch.bench serve` (dart_jax/bench/serve_load.py): C clients, each sending its
questions back to back as streamed chat completions, run in a process of their own (`run_clients`) so
that parsing C streams never competes with the server's engine loop for one interpreter's lock, as
clients on other machines would not. Standard library only: the process starts in a second."""

from __future__ import annotations

import concurrent.futures
import json
import multiprocessing
import threading
import time
import urllib.error
import urllib.request


def ask(url: str, question: str, timeout: float) -> dict:
    """One streamed chat completion -> {status, ttft_s, latency_s, text, dart, usage} (status ≠ 200: error)."""
    body = json.dumps({"model": "dart", "messages": [{"role": "user", "content": question}], "temperature": 0,
                       "stream": True}).encode()
    req = urllib.request.Request(url + "/chat/completions", data=body, method="POST",
                                 headers={"Content-Type": "application/json"})
    t = time.perf_counter()
    out = {"status": 0, "ttft_s": None, "text": "", "dart": None, "usage": None}
    try:
        with urllib.request.urlopen(req, timeout=timeout) as r:
            out["status"] = r.status
            for line in r:
                line = line.strip()
                if not line.startswith(b"data: ") or line == b"data: [DONE]":
                    continue
                chunk = json.loads(line[6:])
                delta = chunk["choices"][0]["delta"].get("content") or ""
                if delta and out["ttft_s"] is None:
                    out["ttft_s"] = time.perf_counter() - t
                out["text"] += delta
                if "dart" in chunk:
                    out["dart"], out["usage"] = chunk["dart"], chunk["usage"]
    except urllib.error.HTTPError as e:
        out["status"] = e.code
    except Exception as e:  # noqa: BLE001 — counted by kind
        out["status"] = type(e).__name__
    out["latency_s"] = time.perf_counter() - t
    return out


def clients(url: str, questions: list[str], n: int, requests: int, timeout: float) -> dict:
    """`n` client threads started together, client c asking questions[(c · requests + r) % len] for r <
    `requests`, back to back -> {results: per client its answers, wall_s, hung: clients still waiting}."""
    results: list[list[dict]] = [[] for _ in range(n)]
    barrier = threading.Barrier(n + 1)

    def client(c: int):
        barrier.wait()
        for r in range(requests):
            results[c].append(ask(url, questions[(c * requests + r) % len(questions)], timeout))

    threads = [threading.Thread(target=client, args=(c,), daemon=True) for c in range(n)]
    for t in threads:
        t.start()
    barrier.wait()
    t0 = time.perf_counter()
    deadline = t0 + timeout * requests + 60
    for t in threads:
        t.join(max(0.0, deadline - time.perf_counter()))
    return {"results": results, "wall_s": time.perf_counter() - t0, "hung": sum(t.is_alive() for t in threads)}


def run_clients(url: str, questions: list[str], n: int, requests: int, timeout: float) -> dict:
    """`clients` in a fresh (spawned) process."""
    with concurrent.futures.ProcessPoolExecutor(1, mp_context=multiprocessing.get_context("spawn")) as pool:
        return pool.submit(clients, url, questions, n, requests, timeout).result()
