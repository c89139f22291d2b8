"""Forward+backward cost of DART (two routed rank-8 adapters) vs one rank-16 LoRA vs full
fine-tuning (no adapter, gradient w.r.t. the base), and PEFT's rank-16 LoRA in PyTorch, on the
same tokens, same process, sides interleaved (timing.py)."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np

from dart_jax.adapters.method import MethodSpec, init_adapters
from dart_jax.bench.timing import interleaved, ratio
from dart_jax.checkpoints.registry import load_model
from dart_jax.models.names import resolve
from dart_jax.models.transformer import forward


def _nll(logits, tokens):
    lp = jax.nn.log_softmax(logits[:, :-1])
    return -jnp.mean(jnp.take_along_axis(lp, tokens[:, 1:, None], -1))


def bench_adapters(model: str = "smollm2-135m-instruct", batch: int = 4, length: int = 256,
                   repeats: int = 5, with_torch: bool = True) -> dict:
    path = resolve(model)
    cfg, base = load_model(path)
    rng = np.random.default_rng(0)
    tokens = jnp.asarray(rng.integers(0, cfg.vocab_size, (batch, length)), jnp.int32)
    positions = jnp.broadcast_to(jnp.arange(length, dtype=jnp.int32), (batch, length))
    # a realistic mix: ~15% of positions inside tool spans
    routes = jnp.asarray((rng.random((batch, length)) < 0.15).astype(np.int32))
    key = jax.random.PRNGKey(0)
    sides = {}

    def adapter_step(spec, route_ids):
        ads = init_adapters(spec, cfg, key)

        @jax.jit
        def step(ads):
            return jax.value_and_grad(
                lambda a: _nll(forward(base, a, tokens, positions, route_ids, None, cfg=cfg)[0], tokens))(ads)
        return lambda: jax.block_until_ready(step(ads))

    sides["dart_2x_r8"] = adapter_step(MethodSpec("dart", rank=8), routes)
    sides["lora_r16"] = adapter_step(MethodSpec("lora", rank=16), jnp.zeros_like(routes))

    @jax.jit
    def full_step(b):
        return jax.value_and_grad(
            lambda p: _nll(forward(p, None, tokens, positions, None, None, cfg=cfg)[0], tokens))(b)
    sides["full_no_adapter"] = lambda: jax.block_until_ready(full_step(base))

    if with_torch:
        import peft
        import torch

        from dart_jax.parity.model_check import load_torch_model
        ref = load_torch_model(path)
        pm = peft.get_peft_model(ref, peft.LoraConfig(r=16, lora_alpha=32, target_modules=[
            "q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"]))
        tt = torch.tensor(np.asarray(tokens), dtype=torch.long)

        def torch_step():
            pm.zero_grad()
            lp = torch.log_softmax(pm(input_ids=tt).logits[:, :-1], -1)
            loss = -lp.gather(-1, tt[:, 1:, None]).mean()
            loss.backward()
        sides["torch_peft_lora_r16"] = torch_step

    results = interleaved(sides, repeats=repeats)
    return {"bench": "adapters", "model": model, "batch": batch, "length": length,
            "device": jax.devices()[0].platform,
            "median_s": {k: v["median_s"] for k, v in results.items()},
            "dart_over_lora": ratio(results, "dart_2x_r8", "lora_r16"),
            "full_over_lora": ratio(results, "full_no_adapter", "lora_r16"),
            **({"torch_peft_over_ours_lora": ratio(results, "torch_peft_lora_r16", "lora_r16")} if with_torch else {}),
            "details": results}
