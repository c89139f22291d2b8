"""run.host_memory: free pages the C allocator keeps go back to the system between a run's stages.

Real glibc, no mocks: blocks below malloc's mmap threshold live in its arenas; freed, they stay
resident until malloc_trim. The pinned last block keeps the heap top in use, so glibc's automatic
top trim cannot return them by itself — the situation of a run whose live buffers sit above freed
ones."""

import ctypes
import os

import pytest

from dart_jax.run import host_memory
from dart_jax.run.run_dir import config_differences

BLOCK = 64 * 1024          # below glibc's initial 128 KiB mmap threshold: an arena chunk
N_BLOCKS = 2048            # 128 MiB


def _glibc():
    libc = host_memory._libc()
    if libc is None or not hasattr(libc, "mallinfo2"):
        pytest.skip("not glibc >= 2.33")
    return libc


def test_release_returns_freed_arena_pages_to_the_system():
    libc = _glibc()
    if any(k.startswith("MALLOC_") for k in os.environ):
        pytest.skip("malloc tuned by the environment (MALLOC_*): the blocks may not live in arenas")
    libc.malloc.argtypes, libc.malloc.restype = [ctypes.c_size_t], ctypes.c_void_p
    libc.free.argtypes, libc.free.restype = [ctypes.c_void_p], None
    host_memory.release()
    blocks = [libc.malloc(BLOCK) for _ in range(N_BLOCKS)]
    assert all(blocks)
    for b in blocks:
        ctypes.memset(b, 1, BLOCK)  # touched: resident
    for b in blocks[:-1]:
        libc.free(b)                 # free, but below the live last block
    before = host_memory.stats()
    released = host_memory.release()
    after = host_memory.stats()
    libc.free(blocks[-1])
    freed_mib = (N_BLOCKS - 1) * BLOCK / 2 ** 20
    assert released
    # the allocator still held the freed blocks (≥ 90% of them) as free bytes ...
    assert before["memory/malloc_free_mib"] >= 0.9 * freed_mib
    # ... resident, and malloc_trim handed ≥ 90% of their pages back (tolerance: other threads allocate)
    assert before["memory/rss_mib"] - after["memory/rss_mib"] >= 0.9 * freed_mib


def test_stats_report_current_and_peak_resident_memory():
    s = host_memory.stats()
    assert s["memory/peak_rss_mib"] > 0
    if "memory/rss_mib" in s:
        assert 0 < s["memory/rss_mib"] <= s["memory/peak_rss_mib"] + 1.0


def test_the_switch_is_no_configuration_difference_on_resume():
    # changes no computed value: a resumed run may turn it off or on, an older run (without it) resumes
    saved = {"train": {"steps": 4}}
    assert config_differences(saved, {"train": {"steps": 4, "release_host_memory": True}}) == []
    assert config_differences({"train": {"steps": 4, "release_host_memory": True}},
                              {"train": {"steps": 4, "release_host_memory": False}}) == []
