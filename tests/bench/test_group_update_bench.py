"""launch.bench group_update on a tiny model: both dart_jax sides take the same updates (their last
losses agree to fp32 rounding: the shared prompt changes only the order of the sums). Timings are
never asserted."""

import pytest

from dart_jax.bench.group_update import bench_group_update, group_batch


def test_group_batch_shares_the_prompt_only():
    b = group_batch(64, group=4, prompt=10, cont=6)
    assert (b["tokens"][:, :10] == b["tokens"][:1, :10]).all() and (b["loss_mask"][:, :10] == 0).all()
    assert (b["loss_mask"][:, 10:] == 1).all() and not (b["tokens"][:, 10:] == b["tokens"][:1, 10:]).all()


def test_group_update_bench_sides_agree(tiny_smollm_dir):
    res = bench_group_update(tiny_smollm_dir, group=4, prompt=48, cont=16, repeats=1, with_torch=False,
                             remat_policy="none", pad_multiple=16)
    loss = res["last_loss"]
    assert loss["shared"] == pytest.approx(loss["per_row"], rel=1e-4, abs=1e-6)
    assert set(res["median_s"]) == {"per_row", "shared", "matmul"}
