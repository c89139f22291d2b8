"""`launch.bench serve` end to end at toy size (a tiny random Llama with SmolLM2's tokenizer, the real
lexical retriever over lab world 1): every side runs, the served tokens equal the lone requests', no
errors, and the overload probe answers only 200 / 429 / 503 with nothing hung. Times are not checked."""

import os

import pytest

from dart_jax.bench import report
from dart_jax.bench.serve_load import bench_serve, check_map_count
from dart_jax.rollout.agent import tool_for
from dart_jax.rollout.protocol import QA
from dart_jax.tools.lexical import LexicalRetriever, build_lexical_index
from dart_jax.tools.retrieval import RetrievalTool

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


@pytest.mark.slow  # ~110 s in CI (an engine compiled per side); what it relies on runs by default in
# tests/serve: tokens under continuous batching equal each request alone (test_engine.py), 429 under
# overload with nothing hung (test_server.py)
def test_serve_bench_runs_every_side(tiny_smollm_dir, tmp_path):
    index = build_lexical_index(os.path.join(ROOT, "data/lab/world1/corpus.jsonl"), str(tmp_path / "lex"))
    tool = tool_for(QA, RetrievalTool(LexicalRetriever(index), topk=1))
    # three clients on two slots: one waits in the queue (one client count: each is its own engine, compiled)
    res = bench_serve(tiny_smollm_dir, clients=(3,), requests=1, alone_n=3, timeout=300, tool=tool, burst=8,
                      max_slots=2)
    assert res["alone"]["requests"] == 3 and res["alone"]["cache_grows"] == 0
    assert set(res["serve"]) == {3}
    for c in (3,):
        s = res["serve"][c]
        assert s["errors"] == 0 and s["ok"] == c and s["hung_clients"] == 0 and s["slots"] == min(c, 2)
        assert s["lone_latency_s"] > 0 and s["rss_gib"] > 0 and s["engine_s"]["decode"] > 0
        assert 1 <= s["rows_per_segment"] <= min(c, 2)
        assert s["columns_per_appended_row"] >= 16  # every tool result appended, in a width of ≥ 16 columns
        assert s["same_tokens_as_alone"] == f"{c}/{c}"
        assert s["cache_grows"] == 0  # KV slots sized up front, warm-up prompts included
        assert res["batch"][c]["requests"] == c
    o = res["overload"]
    assert o["hung"] == 0 and o["only_200_429_503"] and sum(o["codes"].values()) == 8
    assert "clients" in report.text("serve", res)


def test_a_map_limit_too_low_for_the_compiled_programs_is_refused_by_name(tmp_path):
    """XLA:CPU's JIT maps ~1,400 regions per program; the 65,530 default holds ~46, fewer than one 64-slot
    engine compiles: refused before anything loads, naming vm.max_map_count."""
    limit = tmp_path / "max_map_count"
    limit.write_text("65530\n")
    with pytest.raises(SystemExit, match="vm.max_map_count"):
        check_map_count((1, 8, 32, 64), 30, str(limit))
    limit.write_text("1048576\n")
    assert 0 < check_map_count((1, 8, 32, 64), 30, str(limit)) <= 1048576
    assert check_map_count((8,), 30, str(tmp_path / "absent")) == 0
