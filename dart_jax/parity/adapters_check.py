"""Routed-adapter cross-check: dart_jax vs a PyTorch reference built from transformers plus
    y = W x + Σ_i [route = i] · s_i · B_i A_i x
on the same trajectory ids: routed logits and the gradients of a token-mean NLL w.r.t. every A, B."""

from __future__ import annotations

import dataclasses
import time

import jax
import jax.numpy as jnp
import numpy as np

from dart_jax.checkpoints.dart_io import import_dart
from dart_jax.checkpoints.registry import load_model
from dart_jax.models.lora import adapter_names
from dart_jax.models.names import resolve
from dart_jax.models.transformer import forward
from dart_jax.roles.router import route_roles
from dart_jax.tokenization.tokenizer import encode_chat

DEFAULT_TRAJECTORY = [
    {"role": "user", "content": "Answer the given question. Call a search engine by <search> query </search> "
                                "if needed. Question: who wrote the novel war and peace?"},
    {"role": "assistant", "content": "<think>I need the author.</think>\n<search> war and peace novel author "
                                     "</search>\n\n<information>Doc 1(Title: \"War and Peace\") War and Peace is a "
                                     "novel by the Russian author Leo Tolstoy.</information>\n\n<think>It is Tolstoy."
                                     "</think><search> Leo Tolstoy birth year</search>\n\n"
                                     "<answer> Leo Tolstoy </answer>"},
]


@dataclasses.dataclass
class AdapterReport:
    model: str
    adapters: list
    num_tokens: int
    tokens_per_route: dict
    max_abs_logit_diff: float
    max_abs_grad_diff: float
    max_abs_grad: float
    seconds: float
    max_abs_logit: float = 0.0  # the scale of the compared logits (max |torch logit|)

    def to_dict(self):
        return dataclasses.asdict(self)

    def text(self):
        return (f"adapters {self.adapters} on {self.model}: {self.num_tokens} tokens, routes {self.tokens_per_route}\n"
                f"  max |Δlogit| {self.max_abs_logit_diff:.3e}\n"
                f"  max |Δgrad|  {self.max_abs_grad_diff:.3e} (max |grad| {self.max_abs_grad:.3e})")


def crosscheck_adapters(model: str, adapters_dir: str) -> AdapterReport:
    import torch

    from dart_jax.parity import torch_lora
    from dart_jax.parity.model_check import load_torch_model

    t0 = time.time()
    path = resolve(model)
    cfg, base = load_model(path)
    adapters, spec, base, cfg, tok = import_dart(adapters_dir, base, cfg)
    ids = encode_chat(tok, DEFAULT_TRAJECTORY, add_generation_prompt=False)
    tokens = jnp.asarray([ids], jnp.int32)
    positions = jnp.arange(len(ids), dtype=jnp.int32)[None]
    routes = route_roles(tokens, spec)

    def loss_fn(ads):
        logits, _ = forward(base, ads, tokens, positions, routes, None, cfg=cfg)
        lp = jax.nn.log_softmax(logits[:, :-1])
        return -jnp.mean(jnp.take_along_axis(lp, tokens[:, 1:, None], -1)), logits

    (_, ours), grads = jax.jit(jax.value_and_grad(loss_fn, has_aux=True))(adapters)

    ref = load_torch_model(path)
    ref.resize_token_embeddings(cfg.vocab_size, mean_resizing=False)
    with torch.no_grad():
        ref.get_input_embeddings().weight.copy_(torch.tensor(np.asarray(base["embed"])))
        if not cfg.tie_word_embeddings:
            ref.get_output_embeddings().weight.copy_(torch.tensor(np.asarray(base["lm_head"]).T))
    names = adapter_names(adapters)
    route_np = np.asarray(routes)
    factors = [torch_lora.torch_factors(adapters[n]) for n in names]
    handles = torch_lora.install(ref, factors, [adapters[n].scale for n in names], route_np)
    out = ref(input_ids=torch.tensor([ids])).logits
    lp = torch.log_softmax(out[:, :-1], -1)
    loss = -lp.gather(-1, torch.tensor([ids[1:]])[..., None]).mean()
    loss.backward()
    for h in handles:
        h.remove()
    dlogit = float(np.abs(np.asarray(ours) - out.detach().numpy()).max())
    scale_logit = float(np.abs(out.detach().numpy()).max())
    dgrad, gmax = 0.0, 0.0
    for i, name in enumerate(names):
        for (layer, target), (A, B) in factors[i].items():
            r = adapters[name].rank
            ga = np.asarray(grads[name].params[target]["a"][layer]).reshape(-1, r).T
            gb = np.asarray(grads[name].params[target]["b"][layer]).reshape(r, -1).T
            dgrad = max(dgrad, float(np.abs(ga - A.grad.numpy()).max()), float(np.abs(gb - B.grad.numpy()).max()))
            gmax = max(gmax, float(np.abs(A.grad.numpy()).max()), float(np.abs(B.grad.numpy()).max()))
    counts = {("none" if k < 0 else names[k]): int((route_np == k).sum()) for k in np.unique(route_np)}
    return AdapterReport(model=model, adapters=list(names), num_tokens=len(ids), tokens_per_route=counts,
                         max_abs_logit_diff=dlogit, max_abs_grad_diff=dgrad, max_abs_grad=gmax,
                         seconds=round(time.time() - t0, 2), max_abs_logit=scale_logit)
