"""`launch.bench serve`: the OpenAI-compatible server under load, against serving one request at a time
and against the batch-synchronous sampler fed fixed batches.

The policy is the embedded default's DART policy: SmolLM2-135M-Instruct with the shipped QA warm start
merged and a routed reasoning / tool adapter pair (rank 8, fresh: B = 0, so its tokens are the warm
start's while every forward runs both adapters, routed per token, as a trained pair costs). The tool is
the shipped MiniLM index over the shipped corpus; questions are held-out NQ (`nq_corpus_heldout`'s
rows), greedy. Sides, on the same questions:

  alone   each request served by the engine with one slot, one after another (what a server without
          batching gives; its per-request latency is "a lone request's")
  batch   the batch-synchronous agent loop (rollout.agent) on fixed batches of C questions, each batch
          waiting for its longest row (at most BATCH_ROUNDS batches: its rate, not every request)
  serve   C clients over HTTP (streaming, each sending `requests` questions back to back, in a process of
          their own: dart_jax/bench/chat_clients.py) against
          `launch.serve`'s server with `slots` = C (or --max-slots): requests/s, generated tokens/s, p50 / p95 time to
          first token and end-to-end latency, errors; the tokens of every request compared with `alone`
Every engine allocates the KV slots the longest request can need up front (`_capacity`), compiles its
step shapes and serves two untimed requests (`_warm`: the second teaches it the template's shared prefix)
before anything is timed, as a deployed server is warm after its first requests, then times one lone
request on it (`lone_latency_s`). Each engine's programs are dropped when it closes (`_release`); the
process's resident memory is recorded as that engine finishes (`rss_gib`: the model, retriever and
runtime included, and what earlier sides left). Past the 991 shipped
held-out questions (a 64×20 run) clients cycle through them.
Then an overload probe: a server with 2 slots and a queue of 2 taking a burst of 32 requests without
client retries must answer each 200 or 429 / 503, and none may hang.
"""

from __future__ import annotations

import os
import threading
import time

import jax
import numpy as np

from dart_jax.adapters.method import MethodSpec, init_adapters
from dart_jax.bench.chat_clients import ask, run_clients
from dart_jax.checkpoints.registry import load_model, load_tagged_model
from dart_jax.data.corpus import read_jsonl
from dart_jax.data.paths import DATA, repo_path
from dart_jax.rollout.agent import Agent, RolloutConfig, tool_for
from dart_jax.rollout.gather import MAPS_PER_LAYER
from dart_jax.rollout.protocol import QA
from dart_jax.rollout.sampler import bucket, cache_bucket
from dart_jax.rollout.sampling import SamplingConfig
from dart_jax.rollout.tasks import qa_task
from dart_jax.run.demo import default_warm_start
from dart_jax.run.policy import merge_warm_start
from dart_jax.serve.engine import Engine, Request
from dart_jax.serve.server import ChatServer
from dart_jax.tools.retrieval import RetrievalTool, Retriever, ensure_index

SEGMENT = 16  # decode steps per engine segment (the engine's default)
BATCH_ROUNDS = 2  # fixed batches the batch-synchronous baseline runs per client count
HELDOUT_OFFSET = 1024 + 640  # nq_corpus_heldout (eval.datasets): questions no shipped run trained on
RC = RolloutConfig(max_turns=2, max_tokens_per_turn=128, max_response_tokens=1024, max_obs_tokens=400,
                   invalid_action="none", route_mode="role")


def _policy(model: str, tool=None):
    """The model with its shipped QA warm start merged (if one is shipped for it), a fresh routed DART
    pair and the tool (default: MiniLM over the shipped corpus, top-3)."""
    warm = default_warm_start(model, "qa")
    if warm:
        cfg, base = load_model(model)
        base, cfg, tok = merge_warm_start(repo_path(warm), base, cfg)
    else:
        cfg, base, tok = load_tagged_model(model, jax.random.PRNGKey(0))
    adapters = init_adapters(MethodSpec(variant="dart", rank=8, alpha=16.0), cfg, jax.random.PRNGKey(0))
    tool = tool or tool_for(QA, RetrievalTool(Retriever(ensure_index()), topk=3))
    agent = Agent(cfg, tok, QA, tool, SamplingConfig(temperature=0.0), RC)
    return agent, base, adapters


def _questions(all_rows: list[dict], n: int, least: int) -> list[dict]:
    """Up to `n` held-out NQ rows (991 are shipped; clients cycle through them past that), at least `least`."""
    rows = all_rows[HELDOUT_OFFSET:HELDOUT_OFFSET + n]
    if len(rows) < least:
        raise ValueError(f"only {len(rows)} held-out NQ questions; asked for {least}")
    return rows


def _pct(xs: list[float], q: float) -> float:
    return round(float(np.percentile(np.asarray(xs), q)), 3) if xs else float("nan")


def _capacity(prompt_lens) -> int:
    """KV slots the longest request here can need (its prompt, the response budget, one observation chunk and
    a decode segment), allocated up front: no cache growth compiles while requests are timed."""
    # (a prompt is left-padded to its cache bucket, but an observation that would pass the response budget is
    # not appended, so the need stays within this; `cache_grows` in the results would show otherwise)
    return cache_bucket(max(prompt_lens) + RC.max_response_tokens + bucket(RC.max_obs_tokens) + 2 * bucket(SEGMENT) + 1)


def _warm(engine: Engine, prompt_lens, prompts: list[list[int]]):
    """Compile the step shapes (`Engine.warmup`), then serve two different prompts untimed: the second
    teaches the engine the prompt template's shared prefix and compiles its prefill and placement, which a
    live server does once, on its first requests."""
    engine.warmup(tuple(prompt_lens))
    for p in prompts[:2]:
        engine.submit(Request(tuple(p)))
        engine.run_until_idle()
    engine.warmup_prefixes()  # the learnt prefix placed into every row bucket


def _rss_gib() -> float:
    """This process's resident memory now, GiB (Linux; nan elsewhere)."""
    try:
        with open("/proc/self/status") as f:
            return round(next(int(x.split()[1]) for x in f if x.startswith("VmRSS")) / 2 ** 20, 2)
    except (OSError, StopIteration):
        return float("nan")


def _release(engine: Engine):
    """Close an engine and drop every compiled program: on XLA:CPU each executed program stays resident
    (docs/serving.md, "Memory"), so one process serving 1, 8, 32 and 64 slots in turn would hold every
    engine's programs at once (it passed 17 GB before its 32-slot engine). The persistent compilation
    cache still has them."""
    engine.close()
    jax.clear_caches()


def _lone(engine: Engine, prompt: list[int]) -> float:
    """One request served with nothing else in flight on a warm engine: its latency, s."""
    t = time.perf_counter()
    engine.submit(Request(tuple(prompt)))
    engine.run_until_idle()
    return round(time.perf_counter() - t, 3)


def _alone(agent, base, adapters, prompts: list[list[int]], spare: list[list[int]]) -> dict:
    lens = [len(p) for p in prompts + spare]  # the warm-up prompts sized in: no growth once timing starts
    engine = Engine(agent, base, adapters, slots=1, segment=SEGMENT, capacity=_capacity(lens))
    _warm(engine, lens, spare)
    engine.time.clear()
    lat, ids, tokens = [], [], 0
    t0 = time.perf_counter()
    for p in prompts:
        t = time.perf_counter()
        g = engine.submit(Request(tuple(p)))
        engine.run_until_idle()
        traj = g.result()
        lat.append(time.perf_counter() - t)
        ids.append(traj["ids"])
        tokens += int(sum(traj["mask"]))
    wall = time.perf_counter() - t0
    rss = _rss_gib()
    _release(engine)
    return {"requests": len(prompts), "wall_s": round(wall, 2),
            "engine_s": {k: round(v, 1) for k, v in engine.time.items()},
            "requests_per_s": round(len(prompts) / wall, 3),
            "generated_tokens_per_s": round(tokens / wall, 1), "p50_latency_s": _pct(lat, 50),
            "p95_latency_s": _pct(lat, 95), "cache_grows": engine.stats["cache_grows"], "rss_gib": rss, "ids": ids}


def _batch(agent, base, adapters, prompts: list[list[int]], size: int) -> dict:
    agent.rollout(base, adapters, prompts[:size], list(range(size)))  # compile
    t0 = time.perf_counter()
    tokens = 0
    for s in range(0, len(prompts), size):
        chunk = prompts[s:s + size]
        tb = agent.rollout(base, adapters, chunk, list(range(len(chunk))))
        tokens += int(tb.loss_mask.sum())
    wall = time.perf_counter() - t0
    jax.clear_caches()  # its programs (as `_release`)
    return {"batch": size, "requests": len(prompts), "wall_s": round(wall, 2),
            "requests_per_s": round(len(prompts) / wall, 3), "generated_tokens_per_s": round(tokens / wall, 1)}


def _serve(agent, base, adapters, questions: list[str], prompts: list[list[int]], clients: int, requests: int,
           timeout: float, spare: list[list[int]], slots: int) -> dict:
    prompt_lens = [len(p) for p in prompts + spare]
    engine = Engine(agent, base, adapters, slots=slots, segment=SEGMENT, capacity=_capacity(prompt_lens))
    _warm(engine, prompt_lens, spare)
    # a lone request on this engine: what load adds to it
    lone = _lone(engine, prompts[0])
    grows = engine.stats["cache_grows"]  # the warm-up's too: none may happen once timing starts either
    engine.time.clear()
    engine.stats.clear()
    server = ChatServer(engine, "dart", "search_r1", port=0, request_timeout_s=timeout).start()
    try:
        got = run_clients(server.url, questions, clients, requests, timeout)
    finally:
        server.stop()
        rss = _rss_gib()
        _release(engine)
    results, wall, hung = got["results"], got["wall_s"], got["hung"]
    flat = [(c, r, x) for c, rs in enumerate(results) for r, x in enumerate(rs)]
    ok = [x for _, _, x in flat if x["status"] == 200 and x["dart"] is not None]
    errors: dict[str, int] = {}
    for _, _, x in flat:
        if not (x["status"] == 200 and x["dart"] is not None):
            errors[str(x["status"])] = errors.get(str(x["status"]), 0) + 1
    tokens = sum(x["usage"]["completion_tokens"] for x in ok)
    return {"clients": clients, "slots": slots, "requests_per_client": requests, "requests": len(flat), "ok": len(ok),
            "errors": sum(errors.values()) + hung, "errors_by_kind": errors, "hung_clients": hung,
            "wall_s": round(wall, 2), "requests_per_s": round(len(ok) / wall, 3),
            "cache_grows": grows + engine.stats["cache_grows"], "rss_gib": rss, "lone_latency_s": lone,
            # the engine's loop while loaded: seconds per phase (Engine.time), and rows per decode segment (the
            # row bucket decoded: padding rows included)
            "engine_s": {k: round(v, 1) for k, v in engine.time.items()},
            "rows_per_segment": round(engine.stats["segment_rows"] / max(1, engine.stats["segments"]), 1),
            # encoding's padding: columns encoded per appended row (exact row pieces, each at its own width)
            "columns_per_appended_row": round(engine.stats["append_columns"] / max(1, engine.stats["append_rows"]), 1),
            "generated_tokens_per_s": round(tokens / wall, 1),
            "p50_ttft_s": _pct([x["ttft_s"] for x in ok if x["ttft_s"] is not None], 50),
            "p95_ttft_s": _pct([x["ttft_s"] for x in ok if x["ttft_s"] is not None], 95),
            "p50_latency_s": _pct([x["latency_s"] for x in ok], 50),
            "p95_latency_s": _pct([x["latency_s"] for x in ok], 95),
            "texts": {(c * requests + r) % len(questions): x["text"] for c, r, x in flat if x["status"] == 200}}


def _overload(agent, base, adapters, questions: list[str], burst: int = 32, timeout: float = 600.0) -> dict:
    engine = Engine(agent, base, adapters, slots=2, max_waiting=2)
    server = ChatServer(engine, "dart", "search_r1", port=0, request_timeout_s=timeout).start()
    out: list = []
    lock = threading.Lock()

    def one(k):
        x = ask(server.url, questions[k % len(questions)], timeout)
        with lock:
            out.append(x["status"])

    threads = [threading.Thread(target=one, args=(k,), daemon=True) for k in range(burst)]
    t0 = time.perf_counter()
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout + 60)
    hung = sum(t.is_alive() for t in threads)
    server.stop()
    _release(engine)
    codes: dict[str, int] = {}
    for s in out:
        codes[str(s)] = codes.get(str(s), 0) + 1
    return {"burst": burst, "slots": 2, "max_waiting": 2, "codes": codes, "hung": hung,
            "wall_s": round(time.perf_counter() - t0, 2),
            "only_200_429_503": set(codes) <= {"200", "429", "503"}}


def check_map_count(clients: tuple[int, ...], layers: int, path: str = "/proc/sys/vm/max_map_count",
                    who: str = "launch.bench serve", max_obs_tokens: int | None = None) -> int:
    """Refuse, naming the setting, when the kernel's memory-map limit cannot hold the programs this benchmark
    compiles in one process: per engine (1 slot, then each client count) its row buckets × (2 prompt
    widths + the observation widths up to `max_obs_tokens` (default RC's) + the prefix placement + a decode
    segment), and
    ~10 per batch baseline (an upper bound: each engine's programs are dropped when it closes).
    -> the estimated number of maps (0 where the limit is not readable)."""
    from dart_jax.serve.slots import obs_widths, row_buckets
    per_bucket = 2 + len(obs_widths(max_obs_tokens or RC.max_obs_tokens)) + 2
    programs = sum(len(row_buckets(c)) * per_bucket + 10 for c in (1, *clients))
    per_program = MAPS_PER_LAYER * layers
    need = programs * per_program + 20_000
    try:
        with open(path) as f:
            limit = int(f.read())
    except (OSError, ValueError):
        return 0
    if limit < need:
        raise SystemExit(f"{who}: ~{programs} compiled programs need ~{need:,} memory maps on XLA:CPU "
                         f"(~{per_program:,} each), past vm.max_map_count = {limit:,}: raise it "
                         f"(sudo sysctl -w vm.max_map_count={max(need, 1 << 20)}) or pass fewer --clients")
    return need


def bench_serve(model: str = "smollm2-135m-instruct", clients: tuple[int, ...] = (1, 8, 32, 64),
                requests: int = 2, alone_n: int = 16, timeout: float = 900.0, tool=None, burst: int = 32,
                max_slots: int = 0) -> dict:
    """`tool`: the agent's tool function (default the MiniLM retriever over the shipped corpus).
    `max_slots`: the server's rows (0: one per client); more clients than rows wait in its queue, as a
    server sized to its memory serves a burst (a 32-slot engine holds ~10 GiB on XLA:CPU: docs/serving.md)."""
    agent, base, adapters = _policy(model, tool)
    check_map_count(tuple(min(c, max_slots or c) for c in clients), agent.spec.model.num_layers)
    n = max(alone_n, max(clients) * requests)
    all_rows = list(read_jsonl(os.path.join(DATA, "qa", "nq_oracle.jsonl")))
    rows = _questions(all_rows, n, alone_n)
    questions = [r["question"] for r in rows]
    prompts = qa_task(agent.tok, rows)[0]
    # two questions just before the held-out rows, served untimed to warm each engine (`_warm`)
    spare = qa_task(agent.tok, all_rows[HELDOUT_OFFSET - 2:HELDOUT_OFFSET])[0]
    alone = _alone(agent, base, adapters, prompts[:alone_n], spare)
    texts_alone = {k: agent.tok.decode(ids, skip_special_tokens=True) for k, ids in enumerate(alone.pop("ids"))}
    out = {"model": model, "policy": "SmolLM2-135M + QA warm start + DART pair (rank 8, routed per token)",
           "tool": "MiniLM over the shipped corpus, top-3", "rollout": dict(RC.__dict__), "alone": alone,
           "batch": {}, "serve": {}}
    for c in clients:
        # the baseline's rate from at most BATCH_ROUNDS batches (a 64×20 check would batch 1,280 prompts)
        out["batch"][c] = _batch(agent, base, adapters, prompts[:c * min(requests, BATCH_ROUNDS)], c)
        res = _serve(agent, base, adapters, questions, prompts, c, requests, timeout, spare,
                     min(c, max_slots or c))
        texts = res.pop("texts")
        same = [texts[k] == texts_alone[k] for k in texts if k in texts_alone]
        res["same_tokens_as_alone"] = f"{sum(same)}/{len(same)}"
        res["throughput_over_alone"] = round(res["requests_per_s"] / alone["requests_per_s"], 2)
        # against a lone request served by a one-slot engine (the floor's reading), and by this engine
        res["p95_latency_over_lone"] = round(res["p95_latency_s"] / alone["p50_latency_s"], 2)
        res["p95_latency_over_lone_same_engine"] = round(res["p95_latency_s"] / res["lone_latency_s"], 2)
        res["throughput_over_batch"] = round(res["requests_per_s"] / out["batch"][c]["requests_per_s"], 2)
        out["serve"][c] = res
    out["overload"] = _overload(agent, base, adapters, questions, burst)
    return out
