"""Hand-written PyTorch reference for routed LoRA (independent of dart_jax's JAX code):

    y = W x + b + Σ_i m_i · s_i · B_i A_i x,   m_i = [route == i] per token

implemented with forward hooks on the target nn.Linear modules of a transformers model.
"""

from __future__ import annotations

import numpy as np
import torch

MODULES = {"q": "self_attn.q_proj", "k": "self_attn.k_proj", "v": "self_attn.v_proj",
           "o": "self_attn.o_proj", "gate": "mlp.gate_proj", "up": "mlp.up_proj",
           "down": "mlp.down_proj"}


def torch_factors(adapter, requires_grad=True):
    """Our LoraAdapter -> {(layer, target): (A [r, in], B [out, r])} as torch leaves."""
    out = {}
    for target, ab in adapter.params.items():
        a = np.asarray(ab["a"], np.float32)
        b = np.asarray(ab["b"], np.float32)
        r = a.shape[-1]
        for l in range(a.shape[0]):
            A = torch.tensor(a[l].reshape(-1, r).T.copy(), requires_grad=requires_grad)
            B = torch.tensor(b[l].reshape(r, -1).T.copy(), requires_grad=requires_grad)
            out[(l, target)] = (A, B)
    return out


def install(model, adapters: list, scales: list[float], routes: np.ndarray):
    """adapters: list of torch_factors dicts (route id = list index). Returns hook handles."""
    route_t = torch.tensor(routes)
    handles = []
    for l, layer in enumerate(model.model.layers):
        for target, name in MODULES.items():
            module = layer.get_submodule(name)

            def hook(mod, inputs, output, l=l, target=target):
                x = inputs[0]
                for i, (factors, s) in enumerate(zip(adapters, scales)):
                    if (l, target) not in factors:
                        continue
                    A, B = factors[(l, target)]
                    m = (route_t == i).to(x.dtype)[..., None]
                    output = output + m * s * (x @ A.T @ B.T)
                return output

            handles.append(module.register_forward_hook(hook))
    return handles
