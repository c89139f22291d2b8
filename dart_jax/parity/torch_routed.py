"""PyTorch reference for routed generation: a transformers model with two LoRA adapters read from their
PEFT directories, each token's forward routed to the reasoning or the tool adapter by the tags written
so far, decoded greedily — written apart from dart_jax's JAX sampler, engine and router, to check what
`launch.serve` serves (docs/serving.md).

    model = AutoModelForCausalLM.from_pretrained(EXPORT / "base")
    pair = {"reasoning": peft_factors(EXPORT / "peft/reasoning"), "tool": peft_factors(EXPORT / "peft/tool")}
    ids = routed_greedy(model, prompt_ids, pair, open_ids=[<search>], close_ids=[</search>], stops=[[eos]])

Routing (the "dart_jax" convention, roles/router.py): the forward at position i uses the tool adapter
iff a tool span is open after token i (an opening tag opens, a closing tag closes, no nesting), so
every token inside a span, its closing tag included, is predicted by the tool adapter. With
`observations`, each tool call's closing tag is followed by the next observation's ids (as the server
appended them), and decoding goes on after it. `routed_logprobs` scores a served (e.g. sampled)
response teacher-forced. One full forward per token, no KV cache: slow and plain,
which is the point of a reference. Imports torch: reference side only.
"""

from __future__ import annotations

import json
import os

import numpy as np
import torch
from safetensors.numpy import load_file

from dart_jax.checkpoints.peft_io import MODULE_TO_TARGET
from dart_jax.parity.torch_lora import install

ROUTES = {"reasoning": 0, "tool": 1}


def peft_factors(path: str) -> tuple[dict, float]:
    """A PEFT LoRA directory -> ({(layer, target): (A [r, in], B [out, r])} torch tensors, scale alpha / r)."""
    with open(os.path.join(path, "adapter_config.json")) as f:
        conf = json.load(f)
    if conf.get("use_rslora"):
        raise ValueError(f"{path}: rsLoRA adapters are not handled by this reference")
    tensors = load_file(os.path.join(path, "adapter_model.safetensors"))
    out: dict = {}
    for key, value in tensors.items():
        parts = key.split(".")
        layer, module, ab = int(parts[4]), parts[6], parts[7][-1]
        a_b = out.setdefault((layer, MODULE_TO_TARGET[module]), [None, None])
        a_b[0 if ab == "A" else 1] = torch.tensor(np.asarray(value, np.float32))
    return {k: tuple(v) for k, v in out.items()}, float(conf["lora_alpha"]) / float(conf["r"])


def roles(ids: list[int], open_ids, close_ids) -> list[int]:
    """Each position's route: 1 (tool) while a span is open after its token, else 0."""
    out, open_ = [], False
    for t in ids:
        if t in open_ids:
            open_ = True
        elif t in close_ids:
            open_ = False
        out.append(1 if open_ else 0)
    return out


@torch.no_grad()
def routed_greedy(model, prompt: list[int], pair: dict, open_ids, close_ids, stops: list[list[int]],
                  max_new: int, observations: list[list[int]] = ()) -> tuple[list[int], list[float]]:
    """-> (the response greedy decoding writes after `prompt`: generated + observation ids, each
    generated token's log-prob (0 on observation ids)). pair: {"reasoning": (factors, scale), "tool":
    (factors, scale)}; stops: token sequences ending the response (eos, the answer's closing tag);
    `max_new`: response tokens at most."""
    adapters = [pair["reasoning"][0], pair["tool"][0]]
    scales = [pair["reasoning"][1], pair["tool"][1]]
    ids, out, lps = list(prompt), [], []
    pending = list(observations)
    while len(out) < max_new:
        handles = install(model, adapters, scales, np.asarray([roles(ids, open_ids, close_ids)]))
        try:
            logits = model(torch.tensor([ids])).logits[0, -1].float()
        finally:
            for h in handles:
                h.remove()
        tok = int(torch.argmax(logits))
        ids.append(tok)
        out.append(tok)
        lps.append(float(torch.log_softmax(logits, -1)[tok]))
        if any(len(s) <= len(out) and out[-len(s):] == list(s) for s in stops):
            break
        if tok in close_ids:
            if not pending:
                break
            obs = pending.pop(0)
            ids += obs
            out += obs
            lps += [0.0] * len(obs)
    return out[:max_new], lps[:max_new]


@torch.no_grad()
def routed_logprobs(model, prompt: list[int], response: list[int], pair: dict, open_ids, close_ids,
                    temperature: float = 1.0) -> np.ndarray:
    """Teacher-forced: each response token's log-prob at `temperature` under the routed pair (one
    forward over prompt + response) -> f32[len(response)] (observation positions included: the caller
    masks them)."""
    ids = list(prompt) + list(response)
    adapters = [pair["reasoning"][0], pair["tool"][0]]
    scales = [pair["reasoning"][1], pair["tool"][1]]
    handles = install(model, adapters, scales, np.asarray([roles(ids, open_ids, close_ids)]))
    try:
        logits = model(torch.tensor([ids])).logits[0].float() / temperature
    finally:
        for h in handles:
            h.remove()
    lp = torch.log_softmax(logits[len(prompt) - 1:-1], -1)
    return lp.gather(1, torch.tensor(response)[:, None])[:, 0].numpy()
