"""launch.bench suite, the CI smoke of the accelerator command (issue 20): on CPU with the tiny shape
it runs every section and writes a JSON with every field of `suite.FIELDS`; the model-FLOP count's
matmul parameters equal the matmul weights of the initialised model. Timings are never asserted."""

import json
import math

import jax
import numpy as np

from dart_jax.bench import suite
from dart_jax.bench.shapes import model_config
from dart_jax.models.transformer import flatten, init_params
from launch import bench


def _numbers(tree):
    if isinstance(tree, dict):
        for v in tree.values():
            yield from _numbers(v)
    elif isinstance(tree, (int, float)) and not isinstance(tree, bool):
        yield tree


def test_suite_smoke_writes_every_field(tmp_path, capsys):
    path = tmp_path / "suite.json"
    assert bench.main([f"--json={path}", "--shape=tiny", "suite"]) == 0
    res = json.loads(path.read_text())
    assert suite.missing_fields(res) == []
    assert res["backend"] == "cpu" and res["shape"] == "tiny" and res["devices"] >= 1
    assert all(math.isfinite(x) for x in _numbers({k: v for k, v in res.items() if k != "attention"}))
    m = res["train"]["methods"]
    assert m["full"]["trainable_params"] == res["params"]
    assert m["dart"]["trainable_params"] == m["lora16"]["trainable_params"] < res["params"] / 2
    for r in m.values():
        assert r["step_s"] > 0 and r["model_flops"] > 0 and 0 < r["mfu_measured"]
        assert r["mfu_nominal"] is None  # no datasheet peak for a CPU
    # full fine-tuning also computes weight gradients: 6·P vs 4·P per token, the same attention
    assert m["full"]["model_flops"] > m["dart"]["model_flops"] == m["lora16"]["model_flops"]
    assert res["attention"]["cudnn_s"] is None and "cuDNN" in res["attention"]["cudnn_error"]
    assert res["decode"]["bandwidth_bytes_s"] > 0 and res["resume"]["speedup"] > 0
    mem = res["rollout_memory"]["layouts"]
    for r in mem.values():
        assert r["peak_gib"] >= r["weights_gib"] + r["kv_gib"] > 0 and r["tokens_per_s"] > 0
    assert mem["per_layer"]["ratio"] > mem["shared"]["ratio"]  # the per-layer copy is resident
    out = capsys.readouterr().out
    assert "MFU" in out and "rollout memory" in out


def test_model_flops_count_the_models_matmul_weights():
    cfg = model_config("tiny", dtype="float32")
    flat = flatten(init_params(cfg, jax.random.PRNGKey(0)))
    # the layers' projection weights (not norms or biases), and the head: tied, the embedding table once
    assert cfg.tie_word_embeddings and "lm_head" not in flat
    mm = sum(int(np.prod(v.shape)) for k, v in flat.items() if k.startswith("layers/")
             and not k.endswith(("norm", "_bias")))
    p_mm = mm + int(np.prod(flat["embed"].shape))
    b, t = 2, 32
    attn = 4 * cfg.num_layers * t * t * cfg.num_heads * cfg.head_dim * b / 2
    assert suite.update_model_flops(cfg, b, t, trains_base=False) == 4 * p_mm * b * t + 3 * attn
    assert suite.update_model_flops(cfg, b, t, trains_base=True) == 6 * p_mm * b * t + 3 * attn
