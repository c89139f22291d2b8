"""launch.bench matmul on a tiny model: every side timed, the reported fields present, and the two bf16
forms differing on at most 1% of the entries, each by at most one bf16 rounding of the largest (2^-7)."""

from dart_jax.bench.matmul import SIDES, bench_matmul, shapes
from dart_jax.bench.report import text


def test_matmul_bench_times_every_side(tiny_smollm_dir):
    res = bench_matmul(tiny_smollm_dir, rows=(4,), repeats=1)
    assert [(r["name"], r["m"]) for r in res["rows"]] == [("up", 4), ("down", 4), ("head", 4)]
    for r in res["rows"]:
        assert set(r["gflops"]) == set(SIDES) and all(v > 0 for v in r["gflops"].values())
        assert r["agree"]["differing"] <= r["agree"]["of"] // 100 and r["agree"]["max_diff_of_scale"] <= 2.0 ** -7
        assert {"median", "min", "max"} <= set(r["torch_bf16_over_jax_bf16_acc32"])
    assert "bf16-out / fp32-accumulated" in text("matmul", res)


def test_shapes_are_the_models():
    from dart_jax.models.config import ModelConfig
    cfg = ModelConfig("llama", vocab_size=100, hidden_size=8, intermediate_size=12, num_layers=1, num_heads=2,
                      num_kv_heads=1, head_dim=4)
    assert shapes(cfg, rows=(2,)) == [("up", 2, 8, 12), ("down", 2, 12, 8), ("head", 2, 8, 100)]
