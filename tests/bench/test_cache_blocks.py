"""launch.bench cache_blocks on a tiny model: both sides decode the same greedy tokens (the block loop
reads 4 written blocks of 16 of a 128-slot cache) and the result holds every reported field."""

from dart_jax.bench.sampler import bench_cache_blocks


def test_cache_blocks_bench_sides_agree(tiny_smollm_dir):
    res = bench_cache_blocks(tiny_smollm_dir, batch=2, filled=40, capacity=128, new_tokens=16, repeats=1, block=16)
    assert res["same_tokens"]
    assert res["blocks_s"] > 0 and res["whole_s"] > 0 and res["matmul_flops"] > 0
    assert {"median", "min", "max"} <= set(res["ratio"])
