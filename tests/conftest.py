"""Test session set-up: 8 forced CPU devices (sharding tests), fp32 matmuls, shared fixtures."""

import atexit
import os
import shutil
import sys
import tempfile

sys.path.insert(0, os.path.dirname(__file__))
from xla_env import xla_flags  # noqa: E402

os.environ.setdefault("XLA_FLAGS", xla_flags(8))  # 8 forced devices; compile settings: tests/xla_env.py
os.environ.setdefault("JAX_PLATFORMS", "cpu")
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_VERBOSITY", "error")

import jax  # noqa: E402
import pytest  # noqa: E402

jax.config.update("jax_default_matmul_precision", "highest")
# One compilation cache for the session: tests that build the same program (a tiny model's train step,
# a sampler segment) from fresh closures compile it once (measured: test_train_step.py 315 s -> 230 s).
# tests/run_suite.py hands every group's process the same directory (DART_JAX_TEST_XLA_CACHE), so a
# program compiled by one group is a cache hit in the next.
_CACHE = os.environ.get("DART_JAX_TEST_XLA_CACHE") or tempfile.mkdtemp(prefix="dart_jax_test_xla_")
if "DART_JAX_TEST_XLA_CACHE" not in os.environ:
    atexit.register(shutil.rmtree, _CACHE, True)
jax.config.update("jax_compilation_cache_dir", _CACHE)
os.environ["JAX_COMPILATION_CACHE_DIR"] = _CACHE  # the commands tests start keep it too (run/compile_cache.py)
jax.config.update("jax_persistent_cache_min_compile_time_secs", 0)
jax.config.update("jax_persistent_cache_min_entry_size_bytes", 0)


@pytest.fixture(scope="session")
def tiny_dirs(tmp_path_factory):
    """family -> (path of a saved tiny random HF model, the torch model)."""
    import tiny_models
    out = {}
    for family in tiny_models.FAMILIES:
        path = str(tmp_path_factory.mktemp(f"tiny_{family}"))
        out[family] = (path, tiny_models.build(family, path))
    return out


@pytest.fixture(scope="session")
def smollm2():
    """(config, base params, tokenizer) of the embedded SmolLM2-135M-Instruct GGUF."""
    from dart_jax.checkpoints.registry import load_model
    from dart_jax.tokenization.tokenizer import load_tokenizer
    cfg, base = load_model("smollm2-135m-instruct")
    return cfg, base, load_tokenizer("smollm2-135m-instruct")


@pytest.fixture(scope="session")
def tiny_smollm_dir(tmp_path_factory, smollm2):
    """A tiny random Llama saved with SmolLM2's real tokenizer: the quickstart's prompts, tags,
    retriever and rewards at test speed."""
    import tiny_models
    _, _, tok = smollm2
    path = str(tmp_path_factory.mktemp("tiny_smol"))
    tiny_models.build("llama", path, vocab_size=len(tok), hidden_size=32, intermediate_size=48,
                      num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=2048,
                      bos_token_id=1, eos_token_id=2, pad_token_id=2)
    tok.save_pretrained(path)
    return path
