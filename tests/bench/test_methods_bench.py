"""launch.bench methods on a tiny model: the training state is what the accounting says — 12 bytes
per trainable parameter (fp32 master + two AdamW moments) on top of the frozen base; 2-Agent holds
two full states (or two LoRAs over one frozen base). The timed side (each method's train step) is exercised by the
methods' own tests (tests/rl/test_mixlora_train.py, test_two_agent.py); timings are never asserted."""

import pytest

from dart_jax.bench import report
from dart_jax.bench.methods import bench_methods


def test_methods_bench_accounts_memory_per_method(tiny_smollm_dir):
    res = bench_methods(tiny_smollm_dir, batch=2, length=32, repeats=1, dtype="bfloat16", time_steps=False)
    rows, n = res["rows"], res["params"]
    assert set(rows) == {"dart", "lora16", "full", "mixlora", "2agent", "2agent_lora"}
    for name, r in rows.items():
        assert r["base_bytes"] == pytest.approx(2 * n, rel=1e-6), name  # the frozen bf16 base
        # masters + 2 moments, fp32, plus a few scalar counters
        assert 12 * r["trainable_params"] <= r["state_bytes"] <= 12 * r["trainable_params"] + 4096, name
    assert rows["full"]["trainable_params"] == n and rows["2agent"]["trainable_params"] == 2 * n
    assert rows["dart"]["trainable_params"] == rows["lora16"]["trainable_params"]  # 2 × r8 = r16
    assert rows["2agent_lora"]["trainable_params"] == rows["dart"]["trainable_params"]  # two r8 LoRAs, one base
    assert rows["full"]["total_in_P"] == pytest.approx(7.0, abs=0.01)
    assert rows["2agent"]["total_in_P"] == pytest.approx(13.0, abs=0.01)
    assert "| 2agent |" in report.methods(res)
