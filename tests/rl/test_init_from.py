"""`init_from` accepts what the PyTorch systems write: a PEFT LoRA directory (variant lora), an HF model
directory (a verl / Search-R1 actor export: it replaces model.path) and a DART authors' checkpoint."""

import jax
import numpy as np
import pytest

from configs import quickstart
from dart_jax.adapters.method import MethodSpec, init_adapters
from dart_jax.checkpoints.peft_io import export_peft
from dart_jax.run.policy import load_policy
from dart_jax.run.source import classify_source
from dart_jax.run.spec import run_spec


def _config(model_path, init_from, variant):
    c = quickstart.get_config()
    c.model.path, c.warm_start, c.init_from = model_path, "", init_from
    c.method.variant = variant
    return c


def test_peft_directory_starts_the_lora_variant(tiny_smollm_dir, tmp_path):
    c = _config(tiny_smollm_dir, "", "lora")
    cfg, base, tok, _ = load_policy(run_spec(c), None, jax.random.PRNGKey(0))
    ad = init_adapters(MethodSpec("lora", rank=4, alpha=8.0, init_std=0.1), cfg, jax.random.PRNGKey(3))["shared"]
    ad = ad.replace(params={t: {"a": ab["a"], "b": 0.05 * jax.random.normal(jax.random.PRNGKey(4), ab["b"].shape)}
                            for t, ab in ad.params.items()})
    export_peft(ad, cfg, str(tmp_path / "peft"))
    assert classify_source(str(tmp_path / "peft")).kind == "peft"
    c = _config(tiny_smollm_dir, str(tmp_path / "peft"), "lora")
    _, _, _, adapters = load_policy(run_spec(c), None, jax.random.PRNGKey(0))
    jax.tree.map(lambda x, y: np.testing.assert_allclose(np.asarray(x), np.asarray(y), atol=1e-7),
                 adapters["shared"].params, ad.params)
    assert adapters["shared"].scale == pytest.approx(ad.scale)
    with pytest.raises(ValueError, match="PEFT LoRA directory: method.variant must be 'lora'"):
        c = _config(tiny_smollm_dir, str(tmp_path / "peft"), "dart")
        load_policy(run_spec(c), None, jax.random.PRNGKey(0))


def test_hf_directory_replaces_the_model(tiny_smollm_dir):
    c = _config("models/never-loaded", tiny_smollm_dir, "full")
    assert classify_source(tiny_smollm_dir).kind == "hf"
    cfg, base, tok, adapters = load_policy(run_spec(c), None, jax.random.PRNGKey(0))
    assert adapters is None and cfg.hidden_size == 32 and tok.convert_tokens_to_ids("<search>") is not None


def test_authors_checkpoint_starts_dart(tmp_path, smollm2):
    import tiny_models
    from dart_jax.checkpoints.authors_io import import_authors
    path = str(tmp_path / "authors")
    tiny_models.write_authors_dir(path)
    c = _config("models/never-loaded", path, "dart")
    with pytest.raises(FileNotFoundError, match="no tokenizer"):
        load_policy(run_spec(c), None, jax.random.PRNGKey(0))
    smollm2[2].save_pretrained(path)  # any tokenizer; the tag ids come from config.json
    assert classify_source(path).kind == "authors"
    cfg, base, tok, adapters = load_policy(run_spec(c), None, jax.random.PRNGKey(0))
    want = import_authors(path)[2]
    jax.tree.map(np.testing.assert_array_equal, {n: a.params for n, a in adapters.items()},
                 {n: a.params for n, a in want.items()})
    with pytest.raises(ValueError, match="needs method.variant 'dart'"):
        c = _config("x", path, "lora")
        load_policy(run_spec(c), None, jax.random.PRNGKey(0))


def test_unknown_directory_is_named(tmp_path):
    with pytest.raises(FileNotFoundError, match="no dart_adapters.json"):
        classify_source(str(tmp_path))
