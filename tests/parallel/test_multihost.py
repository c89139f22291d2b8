"""Multi-host training on localhost (issue 20): 2 processes × 4 CPU devices (gloo collectives, the
coordinator on a loopback port) run 2 GRPO steps of a tiny model on mesh (2, 1, 4) — data across the
processes, each rolling out its share of the prompts on its own devices — and end with the same
trainable parameters as 1 process × 8 devices (tolerance 2e-5 absolute: fp32, the same rollouts;
the gradient all-reduce runs through gloo instead of in-process, which may sum in another order;
measured 8.1e-6 at the suite's compile settings, 3.8e-6 at XLA's defaults, which took 204 s against
144 s. A process's gradient share lost, or the shares combined unevenly, would move parameters at the
update's scale, the > 1e-3 checked below; a uniform scaling of the gradient would not show through
the clip and AdamW).
A > 4 MiB reduce-scatter through gloo is checked on the way. Only process 0 writes the run's files.
Held-out evaluation during training and launch.evaluate's function split their batches across the
processes and give the single process's numbers and records (the same batches and seeds)."""

import json
import os
import socket
import subprocess
import sys

import numpy as np
import pytest

WORKER = os.path.join(os.path.dirname(__file__), "multihost_worker.py")


def _port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _env():
    env = dict(os.environ)
    env.pop("XLA_FLAGS", None)  # the worker sets its own: its device count, the suite's compile settings
    env["JAX_PLATFORMS"] = "cpu"
    return env


def test_two_processes_train_like_one(tiny_smollm_dir, tmp_path):
    from dart_jax.tools.retrieval import ensure_index
    ensure_index()  # built once here: the workers find it cached instead of racing to build it
    one = tmp_path / "one"
    two = tmp_path / "two"
    ref = subprocess.run([sys.executable, WORKER, tiny_smollm_dir, str(one), "1", "0", "0", "8"], env=_env(),
                         capture_output=True, text=True, timeout=900)
    assert ref.returncode == 0, ref.stderr[-3000:]
    port = _port()
    procs = [subprocess.Popen([sys.executable, WORKER, tiny_smollm_dir, str(two), "2", str(i), str(port), "4"],
                              env=_env(), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
             for i in range(2)]
    outs = []
    try:
        for p in procs:
            outs.append(p.communicate(timeout=900))
    finally:
        for p in procs:
            p.kill()
    for p, (_, err) in zip(procs, outs):
        assert p.returncode == 0, err[-3000:]
    a, b, init = np.load(one / "params.npz"), np.load(two / "params.npz"), np.load(two / "init.npz")
    assert len(a.files) == len(b.files) == len(init.files) > 0
    moved = 0.0
    for k in a.files:
        np.testing.assert_allclose(b[k], a[k], atol=2e-5, rtol=0)
        moved = max(moved, float(np.abs(a[k] - init[k]).max()))
    assert moved > 1e-3  # two updates moved the adapters: not a comparison of two initial states
    # the adapters were exported (a collective: process 1's shards gathered, process 0 wrote)
    exported = set(os.listdir(two / "adapters"))
    assert {"dart_adapters.json", "reasoning", "tool", "sentinel_embeddings.safetensors"} <= exported
    coll = json.loads((two / "collectives.json").read_text())
    assert coll["reduce_scatter_ok"] and coll["bytes_per_device_in"] > 4 * 2 ** 20
    rows = {n: [json.loads(line) for line in (d / "metrics.jsonl").read_text().splitlines()]
            for n, d in (("one", one), ("two", two))}
    assert [r["step"] for r in rows["two"]] == [0, 1, 2]  # one writer: process 0 (step 0: the first evaluation)
    evals = {n: [{k: v for k, v in r.items() if k.startswith("eval/")} for r in rs if "eval/n" in r]
             for n, rs in rows.items()}
    assert len(evals["two"]) == 2 and all(e["eval/n"] == 10 for e in evals["two"])
    for e1, e2 in zip(evals["one"], evals["two"], strict=True):  # batch 8 on process 0, batch 2 on process 1
        assert e1.keys() == e2.keys()
        for k in e1:
            assert e2[k] == pytest.approx(e1[k], abs=1e-6), k
    # launch.evaluate across processes: the records of one process, in the same order, written once
    recs = {n: [json.loads(line) for line in (d / "eval" / "per_question.jsonl").read_text().splitlines()]
            for n, d in (("one", one), ("two", two))}
    assert len(recs["two"]) == 10 and len({r["response"] for r in recs["two"]}) > 1
    key = lambda r: (r["id"], r["sample"], r["response"], r["score"], r["finish"])  # noqa: E731
    assert [key(r) for r in recs["two"]] == [key(r) for r in recs["one"]]
    res = json.loads((two / "eval" / "results.json").read_text())
    assert res["setup"]["processes"] == 2 and res["datasets"]["nq"]["trajectories"] == 10
    assert sorted(os.listdir(two / "checkpoints" / "integrity")) == ["1.json", "2.json"]
