"""Models by Hugging Face hub id, found offline in the local hub cache (dart_jax.models.names), and the
warning a paper-scale model gets on jax's CPU backend (dart_jax.checkpoints.registry).

The cache is a temp directory in the layout `hf download` writes (tests/standins/hub.py), read back here
with huggingface_hub's own scan_cache_dir; logits are compared with transformers' PyTorch model loaded
from the same snapshot."""

import hashlib
import logging
import os
import subprocess
import sys

import jax.numpy as jnp
import numpy as np
import pytest
import torch
import transformers
from huggingface_hub import constants as hf_constants, scan_cache_dir

import tiny_models
from dart_jax.checkpoints import registry
from dart_jax.checkpoints.registry import load_model
from dart_jax.models.config import ModelConfig
from dart_jax.models.names import ModelNotFound, resolve
from dart_jax.models.transformer import forward
from dart_jax.tokenization.tokenizer import load_tokenizer
from standins.hub import tiny_qwen2_in_hub_cache

REPO = "Qwen/Qwen2.5-3B-Instruct"
ROOT = os.path.normpath(os.path.join(os.path.dirname(__file__), "..", ".."))


@pytest.fixture(scope="module")
def hub(tmp_path_factory):
    """(cache dir, snapshot dir) of a tiny Qwen2 cached as REPO."""
    cache = str(tmp_path_factory.mktemp("hf_home") / "hub")
    return cache, tiny_qwen2_in_hub_cache(cache, REPO)


@pytest.fixture
def hub_cache(hub, monkeypatch):
    """The process's hub cache pointed at the temp one, as HF_HUB_CACHE does for a fresh process (the
    variable is read when huggingface_hub is imported, long before a test starts)."""
    monkeypatch.setattr(hf_constants, "HF_HUB_CACHE", hub[0])
    return hub


def test_layout_reads_back_with_huggingface_hub(hub):
    cache, snapshot = hub
    info = scan_cache_dir(cache)
    assert info.warnings == []
    (repo,) = info.repos
    assert repo.repo_id == REPO and repo.repo_type == "model"
    (revision,) = repo.revisions
    assert revision.refs == frozenset({"main"}) and str(revision.snapshot_path) == snapshot
    names = {f.file_name for f in revision.files}
    assert {"config.json", "model.safetensors", "tokenizer.json"} <= names
    weights = next(f for f in revision.files if f.file_name == "model.safetensors")
    assert os.path.islink(weights.file_path)
    with open(weights.file_path, "rb") as f:
        assert weights.blob_path.name == hashlib.sha256(f.read()).hexdigest()


def test_hub_id_resolves_to_the_snapshot_and_loads(hub_cache):
    _, snapshot = hub_cache
    assert resolve(REPO) == snapshot
    cfg, base = load_model(REPO)
    ref_model = transformers.AutoModelForCausalLM.from_pretrained(snapshot).eval()
    tokens = np.random.default_rng(0).integers(3, cfg.vocab_size, (2, 12))
    positions = np.broadcast_to(np.arange(12), tokens.shape)
    ours, _ = forward(base, None, jnp.asarray(tokens), jnp.asarray(positions), None, None, cfg=cfg)
    with torch.no_grad():
        ref = ref_model(input_ids=torch.tensor(tokens)).logits.numpy()
    np.testing.assert_allclose(np.asarray(ours), ref, atol=1e-4, rtol=0)
    text = "Who wrote <search>the Iliad</search>?"
    assert load_tokenizer(REPO).encode(text) == load_tokenizer("smollm2-135m-instruct").encode(text)


def test_missing_hub_id_names_the_download_command(hub_cache):
    cache, _ = hub_cache
    missing = "Qwen/Qwen2.5-7B-Instruct"
    with pytest.raises(ModelNotFound) as e:
        resolve(missing)
    assert isinstance(e.value, FileNotFoundError)
    assert str(e.value) == (f"model '{missing}' is not in the local Hugging Face cache ({cache}); "
                            f"download it with: hf download {missing}")
    with pytest.raises(ModelNotFound, match=f"hf download {missing}"):
        load_model(missing)


def _resolve_in_fresh_process(env: dict) -> subprocess.CompletedProcess:
    clean = {k: v for k, v in os.environ.items() if k not in ("HF_HOME", "HF_HUB_CACHE", "HUGGINGFACE_HUB_CACHE")}
    code = f"from dart_jax.models.names import resolve; print(resolve({REPO!r}))"
    return subprocess.run([sys.executable, "-c", code], cwd=ROOT, env={**clean, **env}, capture_output=True, text=True,
                          timeout=60)


def test_hf_hub_cache_and_hf_home_are_honoured(hub, tmp_path):
    cache, snapshot = hub
    found = _resolve_in_fresh_process({"HF_HUB_CACHE": cache})
    assert found.returncode == 0 and found.stdout.strip() == snapshot, found.stderr
    home = os.path.dirname(cache)  # the fixture's cache is <home>/hub, where HF_HOME puts it
    found = _resolve_in_fresh_process({"HF_HOME": home})
    assert found.returncode == 0 and found.stdout.strip() == snapshot, found.stderr
    empty = str(tmp_path / "empty")
    missing = _resolve_in_fresh_process({"HF_HOME": home, "HF_HUB_CACHE": empty})
    assert missing.returncode != 0
    assert f"ModelNotFound: model '{REPO}' is not in the local Hugging Face cache ({empty})" in missing.stderr


def test_an_existing_local_path_wins_over_the_hub_id(hub_cache, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    tiny_models.build("qwen2", REPO, seed=1)
    assert resolve(REPO) == REPO
    cfg, _ = load_model(REPO)
    assert cfg.vocab_size == tiny_models.COMMON["vocab_size"]  # the local model, not the cached one
    with pytest.raises(FileNotFoundError, match="neither an existing path"):
        resolve("./Qwen/not-here")


QWEN25_3B = dict(model_type="qwen2", vocab_size=151936, hidden_size=2048, intermediate_size=11008, num_layers=36,
                 num_heads=16, num_kv_heads=2, head_dim=128, tie_word_embeddings=True, qkv_bias=True)


def test_a_paper_scale_model_on_cpu_warns_once(monkeypatch, caplog):
    monkeypatch.setattr(registry, "_cpu_warned", False)
    big = ModelConfig(**QWEN25_3B)
    with caplog.at_level(logging.WARNING, logger=registry.__name__):
        assert registry.warn_if_large_on_cpu(big, REPO)
        assert not registry.warn_if_large_on_cpu(big, REPO)
    (record,) = [r for r in caplog.records if r.name == registry.__name__]
    message = record.getMessage()
    # Qwen2.5-3B's model card: 3.09B parameters
    assert message.startswith(f"{REPO} has 3.1B parameters and jax runs on the CPU backend")
    assert "pip install -r requirements-cuda12.txt" in message and "pip install -r requirements-tpu.txt" in message


def test_a_small_model_on_cpu_does_not_warn(hub_cache, monkeypatch, caplog):
    monkeypatch.setattr(registry, "_cpu_warned", False)
    with caplog.at_level(logging.WARNING, logger=registry.__name__):
        load_model(REPO)
    assert not [r for r in caplog.records if r.name == registry.__name__]
    assert registry._cpu_warned is False
