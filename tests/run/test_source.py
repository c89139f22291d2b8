"""run.source.classify_source: one case per kind, each built by the writer that makes it in practice
(export_dart, export_peft, the run's Checkpointer, the authors' layout, an HF save, the hub cache)."""


import jax
import jax.numpy as jnp
import pytest
from huggingface_hub import constants as hf_constants

import tiny_models
from dart_jax.adapters.method import MethodSpec, init_adapters
from dart_jax.checkpoints.dart_io import export_dart
from dart_jax.checkpoints.peft_io import export_peft
from dart_jax.checkpoints.registry import load_tagged_model
from dart_jax.models.names import EMBEDDED, embedded_path
from dart_jax.run.checkpoint import Checkpointer
from dart_jax.run.source import KINDS, classify_source
from standins.hub import tiny_qwen2_in_hub_cache


@pytest.fixture(scope="module")
def tagged(tiny_smollm_dir):
    """(cfg, base, tokenizer, DART adapters) of the tiny model with the tags."""
    cfg, base, tok = load_tagged_model(tiny_smollm_dir, jax.random.PRNGKey(0))
    return cfg, base, tok, init_adapters(MethodSpec("dart", rank=2, alpha=4.0), cfg, jax.random.PRNGKey(1))


def _save_checkpoint(directory: str, step: int = 1) -> None:
    ckpt = Checkpointer(directory)
    ckpt.save(step, {"train": {"params": {"w": jnp.ones(3)}}, "rng": jax.random.PRNGKey(0)}, {"step": step})
    ckpt.close()


def test_dart_and_warm_start_directories(tagged, tmp_path):
    cfg, base, tok, adapters = tagged
    dart = export_dart(str(tmp_path / "dart"), adapters, cfg, base, tok, extra={"kind": "dart", "warm_start": "w"})
    src = classify_source(dart)
    assert (src.kind, src.path, src.manifest["warm_start"]) == ("dart", dart, "w") and "run_dir" not in src.detail
    warm = export_dart(str(tmp_path / "warm"), {"shared": adapters["reasoning"]}, cfg, base, tok,
                       extra={"kind": "warm_start"})
    assert classify_source(warm).kind == "warm_start"


def test_a_run_directory_is_its_adapters_or_its_checkpoints(tagged, tmp_path):
    cfg, base, tok, adapters = tagged
    run = tmp_path / "run"
    _save_checkpoint(str(run / "checkpoints"))
    src = classify_source(str(run))
    assert (src.kind, src.path, src.detail["step"], src.detail["run_dir"]) == ("orbax", str(run / "checkpoints"),
                                                                                None, str(run))
    export_dart(str(run / "adapters"), adapters, cfg, base, tok, extra={"kind": "dart"})
    src = classify_source(str(run))
    assert (src.kind, src.path, src.detail["run_dir"]) == ("dart", str(run / "adapters"), str(run))
    src = classify_source(str(run), step=1)  # a step: the orbax checkpoint, not the export
    assert (src.kind, src.path, src.detail["step"]) == ("orbax", str(run / "checkpoints"), 1)
    assert classify_source(str(run / "checkpoints")).kind == "orbax"
    with pytest.raises(FileNotFoundError, match="step 3 needs the run's orbax checkpoints/"):
        classify_source(str(run / "adapters"), step=3)


def test_peft_authors_and_hf_directories(tagged, tiny_smollm_dir, tmp_path):
    cfg, _, _, adapters = tagged
    peft = str(tmp_path / "peft")
    export_peft(adapters["tool"], cfg, peft)
    assert classify_source(peft).kind == "peft"
    authors = str(tmp_path / "authors")
    tiny_models.write_authors_dir(authors)
    src = classify_source(authors)
    assert (src.kind, src.detail["lora_r"], src.detail["lora_alpha"]) == ("authors", tiny_models.AUTHORS_R,
                                                                          tiny_models.AUTHORS_ALPHA)
    assert classify_source(tiny_smollm_dir).kind == "hf"


def test_model_names_gguf_embedded_and_hub(tmp_path, monkeypatch):
    name = next(iter(EMBEDDED))
    src = classify_source(name)
    assert (src.kind, src.path, src.detail["name"]) == ("embedded", embedded_path(name, EMBEDDED), name)
    assert classify_source(src.path).kind == "gguf"
    cache = str(tmp_path / "hub")
    snapshot = tiny_qwen2_in_hub_cache(cache, "Org/Tiny")
    monkeypatch.setattr(hf_constants, "HF_HUB_CACHE", cache)
    assert classify_source("Org/Tiny") == type(src)("hub", snapshot, {"name": "Org/Tiny"})


def test_what_is_none_of_them_is_named(tmp_path):
    with pytest.raises(FileNotFoundError, match=r"neither a DART adapter directory \(no dart_adapters.json\)"):
        classify_source(str(tmp_path))
    with pytest.raises(FileNotFoundError, match="neither an existing path nor an embedded name"):
        classify_source(str(tmp_path / "missing"))
    (tmp_path / "notes.txt").write_text("x")
    with pytest.raises(FileNotFoundError, match="not a .gguf model"):
        classify_source(str(tmp_path / "notes.txt"))
    assert set(KINDS) == {"dart", "warm_start", "orbax", "authors", "peft", "hf", "gguf", "hub", "embedded"}
