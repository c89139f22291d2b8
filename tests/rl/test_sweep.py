"""The mesh sweep runs the sharded train step on several mesh shapes of the 8 forced host devices;
every shape computes the same loss as one device (tolerance 1e-5)."""

import pytest

import tiny_models
from configs import quickstart
from dart_jax.bench.sweep import sweep_mesh, table


def test_sweep_same_loss_on_every_mesh(tmp_path):
    path = str(tmp_path / "tiny")
    tiny_models.build("llama", path, num_attention_heads=4, num_key_value_heads=2)
    c = quickstart.get_config()
    c.model.path = path
    c.train.mini_batch, c.train.micro_batch = 8, 4
    # the sweep itself: one device, pure data parallel and all three axes at 2, and a shape the host
    # cannot hold (forward logits on six shapes against one device: tests/parallel/test_mesh_sharding.py)
    rows = sweep_mesh(c, [(1, 1, 1), (8, 1, 1), (2, 2, 2), (1, 1, 16)], length=32, steps=2)
    ok = [r for r in rows if "error" not in r]
    assert len(ok) == 3 and "needs 16 devices" in rows[-1]["error"]
    for r in ok[1:]:
        assert r["loss"] == pytest.approx(ok[0]["loss"], abs=1e-5), r["mesh"]
        assert r["compile_s"] > 0 and r["step_s"] > 0 and r["memory_gib_per_device"] > 0
    assert "| 2x2x2 |" in table(rows)
    # the state column: fp32 masters + two fp32 AdamW moments = 12 bytes per trainable (adapter)
    # parameter, plus three int32 counters (updates, skipped, Adam's count), on one device
    import jax

    from dart_jax.adapters.method import init_adapters
    from dart_jax.checkpoints.registry import load_model
    from dart_jax.run.spec import run_spec
    cfg, _ = load_model(path)
    n = sum(x.size for x in jax.tree.leaves(init_adapters(run_spec(c).method, cfg, jax.random.PRNGKey(0))))
    assert ok[0]["state_gib_per_device"] * 2 ** 30 == 12 * n + 12


def test_rollout_sweep_every_layout_on_meshes(tmp_path, capsys):
    """launch.sweep --rollout: every mesh × decode layout decodes; the KV cache is sharded over the
    batch; the memory columns add up (peak ≥ weights + KV) and holding the frozen base per layer for
    training and rollouts ("shared") needs no second copy of the weights, while "per_layer" holds one."""
    import csv

    from launch import sweep
    c = str(tmp_path / "r.csv")
    assert sweep.main(["launch.sweep", "--config=configs/quickstart.py", "--mesh=4,1,2",
                       "--mesh=1,1,16", "--rollout=tiny", "--train=false", "--rollout-batch=8",
                       "--rollout-prompt=16", "--rollout-new=4", "--rollout-dtype=float32", f"--csv={c}"]) == 0
    with open(c) as f:
        rows = list(csv.DictReader(f))
    ok = [r for r in rows if not r.get("error")]
    assert {(r["mesh"], r["layout"]) for r in ok} == {("4x1x2", lay) for lay in ("stacked", "per_layer", "shared")}
    assert any("needs 16 devices" in r["error"] for r in rows if r.get("error"))
    by = {(r["mesh"], r["layout"]): {k: float(v) for k, v in r.items() if k in ("peak_gib", "weights_gib", "kv_gib",
                                                                                 "ratio", "tokens_per_s")}
          for r in ok}
    for key, r in by.items():
        assert r["tokens_per_s"] > 0 and r["peak_gib"] >= r["weights_gib"] + r["kv_gib"] > 0, key
    assert by[("4x1x2", "per_layer")]["ratio"] > 1.5  # the per-layer copy of the weights is resident
    assert by[("4x1x2", "shared")]["ratio"] < 1.3
    # 4 data shards: a quarter of the cache per device; tensor=2 splits the tiny model's 2 KV heads
    assert [r["kv_sharding"] for r in ok if r["mesh"] == "4x1x2"][0] == "P('data', 'tensor')"
    captured = capsys.readouterr()
    assert "| 4x1x2 | shared |" in captured.out
    assert "rollout sweep" in captured.err and "2/2" in captured.err  # progress over the meshes


def test_rollout_memory_from_xla_analysis_matches_the_run():
    """--rollout-abstract (compile only, nothing allocated) gives the measured run's memory ratios."""
    from dart_jax.bench.rollout_mesh import sweep_rollout
    from dart_jax.bench.shapes import model_config
    cfg = model_config("tiny", "float32")
    run = sweep_rollout(cfg, [(2, 1, 4)], 8, 16, 4, log=lambda _: None)
    est = sweep_rollout(cfg, [(2, 1, 4)], 8, 16, 4, log=lambda _: None, abstract=True)
    for a, b in zip(run, est):
        assert a["layout"] == b["layout"] and a["kv_sharding"] == b["kv_sharding"]
        assert b["weights_gib"] == pytest.approx(a["weights_gib"]) and b["kv_gib"] == pytest.approx(a["kv_gib"])
        assert b["ratio"] == pytest.approx(a["ratio"], rel=0.05), a["layout"]
