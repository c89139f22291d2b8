"""The DART authors' checkpoint layout (both adapters concatenated per linear: A [2r, d_in], B [d_out, 2r],
rank channels 0…r−1 = tool, r…2r−1 = reasoning; lora_r / lora_alpha / enter_tokens / exit_tokens in
config.json; tags at the end of the vocabulary), written here by the test itself in that layout, then
imported: our routed forward equals a PyTorch re-implementation of their module."""

import os

import jax
import jax.numpy as jnp
import numpy as np
import pytest
import torch
from safetensors.torch import load_file, save_file

import tiny_models
from dart_jax.checkpoints.authors_io import AuthorsLayoutError, import_authors, is_authors_dir
from dart_jax.models.transformer import forward
from dart_jax.parity import torch_lora
from dart_jax.roles.router import route_roles

R, ALPHA = tiny_models.AUTHORS_R, tiny_models.AUTHORS_ALPHA
ENTER, EXIT = tiny_models.AUTHORS_ENTER, tiny_models.AUTHORS_EXIT


def _their_routes(ids):
    """Their training-time routing, written out: positions p_enter+1 … p_exit use the tool adapter."""
    tool = np.zeros(len(ids), bool)
    inside = False
    for i, t in enumerate(ids):
        if inside:
            tool[i] = True
        if t == ENTER:
            inside = True
        elif t == EXIT:
            inside = False
    return tool


def test_authors_checkpoint_imports_with_parity(tmp_path):
    path = str(tmp_path / "authors")
    model, lora = tiny_models.write_authors_dir(path)
    assert is_authors_dir(path)
    rng = np.random.default_rng(0)
    ids = rng.integers(3, 120, 40)
    ids[5], ids[11], ids[20], ids[27] = ENTER, EXIT, ENTER, EXIT
    tool = _their_routes(ids)
    assert tool.sum() == 13  # positions 6…11 and 21…27

    # their module: y = W x + b + s · B_cat (A_cat x ⊙ channel mask), channels 0…r−1 on tool tokens
    # (dart_jax/parity/torch_lora.py `install_concatenated`, fed the halves of their tensors)
    layers = {"self_attn.q_proj": "q", "self_attn.k_proj": "k", "self_attn.v_proj": "v", "self_attn.o_proj": "o",
              "mlp.gate_proj": "gate", "mlp.up_proj": "up", "mlp.down_proj": "down"}
    tool_f, reas_f = {}, {}
    for prefix, (A, B) in lora.items():
        key = (int(prefix.split(".")[2]), layers[prefix.split(".", 3)[3]])
        tool_f[key], reas_f[key] = (A[:R], B[:, :R]), (A[R:], B[:, R:])
    handles, _ = torch_lora.install_concatenated(model, tool_f, reas_f, ALPHA / R, tool[None].astype(np.int64))
    with torch.no_grad():
        theirs = model(input_ids=torch.tensor(ids[None])).logits[0].numpy()
    for h in handles:
        h.remove()

    cfg, base, adapters, spec, tok, meta = import_authors(path)
    assert meta == {"lora_r": R, "lora_alpha": ALPHA, "targets": sorted(["q", "k", "v", "o", "gate", "up", "down"])}
    assert spec.convention == "authors" and tok is None
    tokens = jnp.asarray(ids[None], jnp.int32)
    routes = route_roles(tokens, spec)
    np.testing.assert_array_equal(np.asarray(routes)[0], tool.astype(np.int32))  # reasoning 0, tool 1
    ours, _ = jax.jit(forward, static_argnames="cfg")(base, adapters, tokens, jnp.arange(len(ids))[None], routes,
                                                      None, cfg=cfg)
    np.testing.assert_allclose(np.asarray(ours)[0], theirs, atol=2e-4, rtol=1e-4)
    # the adapters really act: without them the logits differ
    plain, _ = forward(base, None, tokens, jnp.arange(len(ids))[None], None, None, cfg=cfg)
    assert np.abs(np.asarray(plain)[0] - theirs).max() > 1e-2


def test_a_wrong_layout_names_the_tensor(tmp_path):
    path = str(tmp_path / "bad")
    tiny_models.write_authors_dir(path)
    weights = load_file(os.path.join(path, "model.safetensors"))
    weights["model.layers.1.mlp.up_proj.lora_A.weight"] = weights["model.layers.1.mlp.up_proj.lora_A.weight"][:R]
    save_file(weights, os.path.join(path, "model.safetensors"), metadata={"format": "pt"})
    with pytest.raises(AuthorsLayoutError, match="mlp.up_proj layer 1"):
        import_authors(path)
