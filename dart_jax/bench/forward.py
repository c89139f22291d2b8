"""Forward throughput: dart_jax vs transformers on the same model and tokens, same process."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np

from dart_jax.bench.timing import time_fn
from dart_jax.checkpoints.registry import load_model, resolve
from dart_jax.models.transformer import forward


def bench_forward(model: str = "smollm2-135m-instruct", batch: int = 8, length: int = 512,
                  repeats: int = 3, compute_dtype: str = "float32", torch_threads: int | None = None) -> dict:
    import torch

    from dart_jax.parity.crosscheck import load_torch_model

    path = resolve(model)
    cfg, base = load_model(path, compute_dtype=compute_dtype, param_dtype=compute_dtype)
    rng = np.random.default_rng(0)
    tokens = rng.integers(0, cfg.vocab_size, (batch, length)).astype(np.int32)
    positions = np.broadcast_to(np.arange(length, dtype=np.int32), (batch, length))
    fwd = jax.jit(lambda b, t, p: forward(b, None, t, p, None, None, cfg=cfg)[0])
    jt, jp = jnp.asarray(tokens), jnp.asarray(positions)
    ours = time_fn(lambda: fwd(base, jt, jp).block_until_ready(), repeats=repeats)

    if torch_threads:
        torch.set_num_threads(torch_threads)
    ref = load_torch_model(path)
    tdtype = {"float32": torch.float32, "bfloat16": torch.bfloat16}[compute_dtype]
    ref = ref.to(tdtype)
    tt = torch.tensor(tokens, dtype=torch.long)

    def run_torch():
        with torch.no_grad():
            ref(input_ids=tt).logits

    theirs = time_fn(run_torch, repeats=repeats)
    n = batch * length
    return {
        "bench": "forward", "model": model, "batch": batch, "length": length, "dtype": compute_dtype,
        "device": str(jax.devices()[0].platform), "torch_threads": torch.get_num_threads(),
        "ours_tokens_per_s": n / ours["median_s"], "transformers_tokens_per_s": n / theirs["median_s"],
        "speedup": theirs["median_s"] / ours["median_s"],
        "ours": ours, "transformers": theirs,
    }
