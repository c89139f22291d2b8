"""HF directory import: sharded index, bf16 files, sharded placement, and errors that name tensors."""

import json
import os
import shutil

import jax.numpy as jnp
import numpy as np
import pytest
import torch
from safetensors.numpy import load_file, save_file

import tiny_models
from dart_jax.checkpoints.loader import CheckpointMismatch
from dart_jax.checkpoints.registry import load_model
from dart_jax.checkpoints.safetensors_mmap import SafetensorsFile
from dart_jax.models.config import config_from_hf_dict
from dart_jax.models.transformer import forward
from dart_jax.parallel.mesh import make_mesh


def _copy(src, dst):
    shutil.copytree(src, dst)
    return str(dst)


def _tensors(path):
    return load_file(os.path.join(path, "model.safetensors"))


def test_sharded_index_and_bf16(tmp_path):
    model = tiny_models.build("qwen2", str(tmp_path / "fp32"))
    model.to(torch.bfloat16).save_pretrained(tmp_path / "bf16", max_shard_size="20KB")
    files = os.listdir(tmp_path / "bf16")
    assert "model.safetensors.index.json" in files and sum(f.endswith(".safetensors") for f in files) > 3
    cfg32, base32 = load_model(str(tmp_path / "fp32"))
    cfg16, base16 = load_model(str(tmp_path / "bf16"))
    ref = model.state_dict()["model.layers.1.self_attn.q_proj.weight"].to(torch.bfloat16).float().numpy()
    ours = np.asarray(base16["layers"]["q"][1]).reshape(cfg16.hidden_size, -1).T
    np.testing.assert_array_equal(ours, ref)
    diff = np.abs(np.asarray(base32["embed"]) - np.asarray(base16["embed"])).max()
    assert 0 < diff < 0.01


def test_mmap_reader_matches_safetensors(tiny_dirs):
    path, _ = tiny_dirs["llama"]
    f = SafetensorsFile(os.path.join(path, "model.safetensors"))
    ref = _tensors(path)
    assert set(f.keys()) == set(ref)
    for k, v in ref.items():
        np.testing.assert_array_equal(np.asarray(f.get(k)), v)
        assert isinstance(f.get(k).base, np.memmap) or isinstance(f.get(k), np.memmap)


def test_missing_extra_and_misshaped_tensors_are_named(tiny_dirs, tmp_path):
    path, _ = tiny_dirs["llama"]
    tensors = _tensors(path)
    cases = {
        "missing": lambda t: t.pop("model.layers.1.mlp.up_proj.weight"),
        "extra": lambda t: t.__setitem__("model.layers.0.self_attn.mystery.weight", np.zeros(3, np.float32)),
        "misshaped": lambda t: t.__setitem__("model.layers.0.self_attn.k_proj.weight", np.zeros((8, 64), np.float32)),
    }
    expect = {"missing": "model.layers.1.mlp.up_proj.weight",
              "extra": "model.layers.0.self_attn.mystery.weight",
              "misshaped": "model.layers.0.self_attn.k_proj.weight: file has (8, 64), expected (32, 64)"}
    for case, mutate in cases.items():
        d = _copy(path, tmp_path / case)
        t = dict(tensors)
        mutate(t)
        save_file(t, os.path.join(d, "model.safetensors"))
        with pytest.raises(CheckpointMismatch, match=case) as err:
            load_model(d)
        assert expect[case] in str(err.value)


def test_unsupported_architecture_and_bad_config_are_named(tiny_dirs, tmp_path):
    path, _ = tiny_dirs["llama"]
    d = _copy(path, tmp_path / "mistral")
    with open(os.path.join(d, "config.json")) as f:
        cfg = json.load(f)
    cfg["model_type"] = "mistral"
    with open(os.path.join(d, "config.json"), "w") as f:
        json.dump(cfg, f)
    with pytest.raises(ValueError, match="unsupported architecture model_type='mistral'"):
        load_model(d)
    with pytest.raises(ValueError, match="missing required field 'hidden_size'"):
        config_from_hf_dict({"model_type": "llama", "vocab_size": 3})
    with pytest.raises(ValueError, match="unsupported rope scaling type 'yarn'"):
        config_from_hf_dict({**cfg, "model_type": "llama", "rope_scaling": {"rope_type": "yarn", "factor": 2.0},
                             "rope_parameters": None})
    with pytest.raises(FileNotFoundError, match="neither an existing path nor an embedded name"):
        load_model(str(tmp_path / "nowhere"))


def test_rope_scaling_read_from_classic_layout():
    classic = {"model_type": "llama", "vocab_size": 8, "hidden_size": 8, "intermediate_size": 8,
               "num_hidden_layers": 1, "num_attention_heads": 2, "rope_theta": 500000.0,
               "rope_scaling": {"rope_type": "llama3", "factor": 32.0, "low_freq_factor": 1.0,
                                "high_freq_factor": 4.0, "original_max_position_embeddings": 8192}}
    cfg = config_from_hf_dict(classic)
    assert cfg.rope_theta == 500000.0 and cfg.rope_scaling.factor == 32.0
    assert cfg.head_dim == 4 and cfg.num_kv_heads == 2


def test_load_straight_into_sharded_arrays(tiny_dirs):
    path, _ = tiny_dirs["llama"]
    mesh = make_mesh((1, 2, 4))
    cfg, base = load_model(path, mesh=mesh)
    q = base["layers"]["q"]
    assert len(q.sharding.device_set) == 8
    assert q.addressable_shards[0].data.shape == (cfg.num_layers, cfg.hidden_size // 2, cfg.num_heads // 4,
                                                  cfg.head_dim)
    _, plain = load_model(path)
    np.testing.assert_array_equal(np.asarray(q), np.asarray(plain["layers"]["q"]))
    tokens = jnp.arange(8, dtype=jnp.int32)[None] + 3
    a, _ = forward(base, None, tokens, jnp.arange(8)[None], None, None, cfg=cfg)
    b, _ = forward(plain, None, tokens, jnp.arange(8)[None], None, None, cfg=cfg)
    np.testing.assert_allclose(np.asarray(a), np.asarray(b), atol=1e-5)
