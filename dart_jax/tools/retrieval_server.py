"""Search-R1-compatible retrieval over HTTP (REFERENCE §8), both directions.

    POST /retrieve {"queries": [str], "topk": int, "return_scores": bool}
      -> {"result": [[{"document": {"id", "contents"}, "score": float}, …], …]}
         (bare document dicts when return_scores is false)

The server binds to loopback by default; malformed JSON or fields get 400, oversized batches 413,
unknown paths 404. `RemoteRetriever` speaks the same contract, so training can point at this
server or at an existing Search-R1 retrieval server.
"""

from __future__ import annotations

import json
import threading
import urllib.error
import urllib.request
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

from dart_jax.tools.retrieval import Searcher


def make_server(searcher: Searcher, host: str = "127.0.0.1", port: int = 8000, max_batch: int = 512,
                max_topk: int = 100, max_body: int = 8 << 20) -> ThreadingHTTPServer:
    lock = threading.Lock()  # the encoder and faiss index are shared; one search at a time

    class Handler(BaseHTTPRequestHandler):
        def log_message(self, *args):
            pass

        def _send(self, code: int, payload: dict):
            body = json.dumps(payload).encode()
            self.send_response(code)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def do_GET(self):
            if self.path == "/health":
                return self._send(200, {"status": "ok"})
            self._send(404, {"error": f"unknown path {self.path}; use POST /retrieve"})

        def do_POST(self):
            if self.path != "/retrieve":
                return self._send(404, {"error": f"unknown path {self.path}; use POST /retrieve"})
            try:
                length = int(self.headers.get("Content-Length", "0"))
            except ValueError:
                return self._send(400, {"error": "bad Content-Length"})
            if length > max_body:
                return self._send(413, {"error": f"body of {length} bytes exceeds {max_body}"})
            try:
                req = json.loads(self.rfile.read(length) or b"null")
            except (json.JSONDecodeError, UnicodeDecodeError) as e:
                return self._send(400, {"error": f"invalid JSON: {e}"})
            if not isinstance(req, dict) or not isinstance(req.get("queries"), list) \
                    or not all(isinstance(q, str) for q in req["queries"]):
                return self._send(400, {"error": "field 'queries' must be a list of strings"})
            topk = req.get("topk", 3)
            if not isinstance(topk, int) or isinstance(topk, bool) or not 1 <= topk <= max_topk:
                return self._send(400, {"error": f"field 'topk' must be an integer in [1, {max_topk}]"})
            if len(req["queries"]) > max_batch:
                return self._send(413, {"error": f"{len(req['queries'])} queries exceed the batch limit {max_batch}"})
            with lock:
                hits = searcher.search(req["queries"], topk)
            if req.get("return_scores", False):
                result = [[{"document": d, "score": s} for d, s in row] for row in hits]
            else:
                result = [[d for d, _ in row] for row in hits]
            self._send(200, {"result": result})

    return ThreadingHTTPServer((host, port), Handler)


class RemoteRetriever:
    """Client of a Search-R1 retrieval server; same `search` interface as `Retriever`."""

    def __init__(self, url: str, timeout_s: float = 60.0):
        self.url = url.rstrip("/") + ("" if url.rstrip("/").endswith("/retrieve") else "/retrieve")
        self.timeout_s = timeout_s

    def search(self, queries: list[str], topk: int = 3) -> list[list[tuple[dict, float]]]:
        body = json.dumps({"queries": list(queries), "topk": topk, "return_scores": True}).encode()
        req = urllib.request.Request(self.url, data=body, headers={"Content-Type": "application/json"})
        try:
            with urllib.request.urlopen(req, timeout=self.timeout_s) as resp:
                payload = json.loads(resp.read())
        except urllib.error.HTTPError as e:
            raise RuntimeError(f"retriever {self.url} answered {e.code}: {e.read().decode(errors='replace')}") from None
        out = []
        for row in payload["result"]:
            out.append([(r["document"], float(r.get("score", 0.0))) if "document" in r else (r, 0.0) for r in row])
        return out
