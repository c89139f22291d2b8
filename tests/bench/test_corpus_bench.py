"""launch.bench corpus on a small synthetic corpus: the offset table is what the file holds, and reading by
offset holds far less than the rows as objects."""

from dart_jax.bench.corpus import bench_corpus


def test_offset_table_is_eight_bytes_a_passage():
    res = bench_corpus(n=50_000, lookups=2000)
    assert res["passages"] == 50_000 and res["lookups"] == 2000
    # one uint64 per passage + the .npy header (128 bytes), scaled to a million passages
    assert abs(res["offsets_mib_per_million"] - (8 * 50_000 + 128) / 2 ** 20 * 20) < 1e-9
    # passages read by offset hold (almost) nothing on the heap; held as dicts they hold ~0.5 KiB each
    assert res["by_offset_anon_mib_per_million"] < 0.2 * res["as_objects_rss_mib_per_million"], res
    assert res["lookup_us"] > 0 and res["scan_s"] > 0
