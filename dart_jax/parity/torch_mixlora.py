"""PyTorch reference for MixLoRA, written from the method's definition (MoE-PEFT's `mixlora`
semantics) and independently of dart_jax's JAX code; imports torch only (plus numpy to read the
factors). Reference side of tests/models/test_mixlora.py.

`MixLoraMLP` replaces a transformers Llama MLP module: fp32 expert-gate logits (MoE-PEFT's
router), softmax, top-k, the k weights renormalised; each token is *dispatched* to its selected
experts (gathered by index, as MoE-PEFT does — not the dense all-experts form of models.mixlora);
an expert runs the shared frozen gate / up projections (computed once) plus its own LoRAs, SiLU,
then the frozen down projection plus its down LoRA; outputs are weighted and index-added in fp32. The gate logits of
every call are kept for `load_balancing_loss`, a direct transcription of the Mixtral loss with an
attention mask (MoE-PEFT's `_mixtral_load_balancing_loss_func`).
"""

from __future__ import annotations

import numpy as np
import torch
import torch.nn.functional as F


class MixLoraMLP(torch.nn.Module):
    """gate: [D, E] tensor (the expert gate); experts: {target: (A [E, r, in], B [E, out, r])} tensors; scale s."""

    def __init__(self, mlp: torch.nn.Module, gate: torch.Tensor, experts: dict, scale: float, top_k: int):
        super().__init__()
        self.mlp, self.gate, self.experts, self.scale, self.top_k = mlp, gate, experts, scale, top_k
        self.logits: list[torch.Tensor] = []

    def _lora(self, target: str, e: int, x: torch.Tensor) -> torch.Tensor:
        a, b = self.experts[target]
        return self.scale * ((x @ a[e].T) @ b[e].T)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        shape, dtype = x.shape, x.dtype
        flat = x.reshape(-1, shape[-1])
        logits = flat.float() @ self.gate
        self.logits.append(logits)
        probs = F.softmax(logits, dim=-1, dtype=torch.float32)
        weights, selected = torch.topk(probs, self.top_k, dim=-1)
        weights = weights / weights.sum(dim=-1, keepdim=True)
        common_gate, common_up = self.mlp.gate_proj(flat), self.mlp.up_proj(flat)
        out = torch.zeros(flat.shape, dtype=torch.float32)
        for e in range(self.gate.shape[1]):
            rows, slot = torch.where(selected == e)
            if rows.numel() == 0:
                continue
            xe = flat[rows]
            g = common_gate[rows] + self._lora("gate", e, xe)
            u = common_up[rows] + self._lora("up", e, xe)
            h = F.silu(g) * u
            y = self.mlp.down_proj(h) + self._lora("down", e, h)
            out = out.index_add(0, rows, y.float() * weights[rows, slot, None])
        return out.reshape(shape).to(dtype)


def torch_experts(experts) -> tuple[list[torch.Tensor], list[dict], list]:
    """models.mixlora.MixLoraExperts -> per layer (gate [D, E], {target: (A [E, r, in], B [E, out, r])}),
    torch leaves with grad; and the flat list of leaves."""
    gates, factors, leaves = [], [], []
    params = experts.params
    for layer in range(params["router"].shape[0]):
        r = torch.tensor(np.asarray(params["router"][layer], np.float32), requires_grad=True)
        f = {}
        for t in ("gate", "up", "down"):
            a = torch.tensor(np.asarray(params[t]["a"][layer], np.float32).transpose(0, 2, 1).copy(),
                             requires_grad=True)
            b = torch.tensor(np.asarray(params[t]["b"][layer], np.float32).transpose(0, 2, 1).copy(),
                             requires_grad=True)
            f[t] = (a, b)
            leaves += [a, b]
        gates.append(r)
        factors.append(f)
        leaves.append(r)
    return gates, factors, leaves


def install(model, experts, scale: float, top_k: int) -> tuple[list[MixLoraMLP], list[torch.Tensor], list]:
    """Replace every layer's MLP of a transformers Llama by MixLoraMLP. -> (modules, gates, factors)."""
    gates, factors, _ = torch_experts(experts)
    modules = []
    for i, layer in enumerate(model.model.layers):
        m = MixLoraMLP(layer.mlp, gates[i], factors[i], scale, top_k)
        layer.mlp = m
        modules.append(m)
    return modules, gates, factors


def load_balancing_loss(gate_logits: torch.Tensor, num_experts: int, top_k: int,
                        attention_mask: torch.Tensor | None) -> torch.Tensor:
    """Mixtral's auxiliary loss over the gate logits of all layers concatenated ([L·B·T, E], layer
    major), padding excluded by attention_mask [B, T] — without the coefficient."""
    routing_weights = F.softmax(gate_logits, dim=-1)
    _, selected = torch.topk(routing_weights, top_k, dim=-1)
    expert_mask = F.one_hot(selected, num_experts)
    if attention_mask is None:
        tokens_per_expert = torch.mean(expert_mask.float(), dim=0)
        gate_prob = torch.mean(routing_weights, dim=0)
    else:
        b, t = attention_mask.shape
        layers = routing_weights.shape[0] // (b * t)
        m = (attention_mask[None, :, :, None, None].expand(layers, b, t, top_k, num_experts)
             .reshape(-1, top_k, num_experts))
        tokens_per_expert = torch.sum(expert_mask.float() * m, dim=0) / torch.sum(m, dim=0)
        mp = attention_mask[None, :, :, None].expand(layers, b, t, num_experts).reshape(-1, num_experts)
        gate_prob = torch.sum(routing_weights * mp, dim=0) / torch.sum(mp, dim=0)
    return torch.sum(tokens_per_expert * gate_prob.unsqueeze(0)) * num_experts
