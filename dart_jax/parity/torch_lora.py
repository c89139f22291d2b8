"""PyTorch reference for routed LoRA, written independently of dart_jax's JAX code:

    y = W x + b + Σ_i m_i · s_i · B_i A_i x,   m_i = [route == i] per token

installed as forward hooks on the target nn.Linear modules of a transformers model. Used by the
routed-adapter tests and by `launch.crosscheck --adapters`. Imports torch: reference side only.
"""

from __future__ import annotations

import numpy as np
import torch

from dart_jax.checkpoints.peft_io import HF_MODULES


def torch_factors(adapter) -> dict:
    """A LoraAdapter -> {(layer, target): (A [r, in], B [out, r])}, torch leaves with grad."""
    out = {}
    for target, ab in adapter.params.items():
        a = np.asarray(ab["a"], np.float32)
        b = np.asarray(ab["b"], np.float32)
        r = a.shape[-1]
        for layer in range(a.shape[0]):
            out[(layer, target)] = (torch.tensor(a[layer].reshape(-1, r).T.copy(), requires_grad=True),
                                    torch.tensor(b[layer].reshape(r, -1).T.copy(), requires_grad=True))
    return out


def install(model, adapters: list[dict], scales: list[float], routes: np.ndarray) -> list:
    """adapters: torch_factors dicts, route id = list index; routes: int [B, T]. -> hook handles."""
    route_t = torch.tensor(np.asarray(routes))
    handles = []
    for layer_idx, layer in enumerate(model.model.layers):
        for target, name in HF_MODULES.items():
            def hook(mod, inputs, output, layer_idx=layer_idx, target=target):
                x = inputs[0]
                for i, (factors, s) in enumerate(zip(adapters, scales)):
                    if (layer_idx, target) in factors:
                        A, B = factors[(layer_idx, target)]
                        m = (route_t == i).to(x.dtype)[..., None]
                        output = output + (m.float() * s * (x.float() @ A.T @ B.T)).to(output.dtype)
                return output
            handles.append(layer.get_submodule(name).register_forward_hook(hook))
    return handles


def install_concatenated(model, tool: dict, reasoning: dict, scale: float, routes: np.ndarray) -> tuple[list, list]:
    """The DART authors' module: per linear one rank-2r LoRA, A_cat = [A_tool; A_reas] [2r, in],
    B_cat = [B_tool, B_reas] [out, 2r], with a per-token channel mask (channels 0…r−1 on tool tokens,
    r…2r−1 on reasoning tokens, none on padding):

        y = W x + b + s · B_cat ((A_cat x) ⊙ mask)

    One pair of rank-2r matmuls per linear (the hook reference, `install`, runs both rank-r adapters
    on every token). tool / reasoning: `torch_factors` dicts with the same keys and rank; routes: int
    [B, T] (0 reasoning, 1 tool, −1 none). -> (hook handles, the trainable [A_cat, B_cat] leaves)."""
    route_t = torch.tensor(np.asarray(routes))
    r = next(iter(tool.values()))[0].shape[0]
    mask = torch.zeros(*route_t.shape, 2 * r)
    mask[..., :r] = (route_t == 1)[..., None].float()
    mask[..., r:] = (route_t == 0)[..., None].float()
    handles, params = [], []
    for layer_idx, layer in enumerate(model.model.layers):
        for target, name in HF_MODULES.items():
            if (layer_idx, target) not in tool:
                continue
            (at, bt), (ar, br) = tool[(layer_idx, target)], reasoning[(layer_idx, target)]
            a_cat = torch.cat([at.detach(), ar.detach()], 0).requires_grad_(True)
            b_cat = torch.cat([bt.detach(), br.detach()], 1).requires_grad_(True)
            params += [a_cat, b_cat]

            def hook(mod, inputs, output, a_cat=a_cat, b_cat=b_cat):
                return output + scale * ((inputs[0] @ a_cat.T) * mask.to(output.dtype)) @ b_cat.T
            handles.append(layer.get_submodule(name).register_forward_hook(hook))
    return handles, params
