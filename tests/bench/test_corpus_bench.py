"""launch.bench corpus on a small synthetic corpus: the figures it reports are what the files hold."""

from dart_jax.bench.corpus import bench_corpus


def test_offset_table_is_eight_bytes_a_passage():
    res = bench_corpus(n=5000, lookups=200)
    assert res["passages"] == 5000 and res["lookups"] == 200
    # one uint64 per passage + the .npy header (128 bytes), scaled to a million passages
    assert abs(res["offsets_mib_per_million"] - (8 * 5000 + 128) / 2 ** 20 * 200) < 1e-9
    assert res["lookup_us"] > 0 and res["scan_s"] > 0
