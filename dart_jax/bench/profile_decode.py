"""Where a batch's greedy decode spends its time: our prefill and decode modules' executed instructions
against transformers' `generate` (aten ops), in bench/profile.py's op classes.

    python -m launch.bench profile_decode                      SmolLM2-135M fp32, 32 rows, 128 new tokens
    python -m launch.bench profile_decode --dtype=bfloat16
"""

from __future__ import annotations

import time

from dart_jax.bench.profile import profile_torch, profile_xla


def bench_profile_decode(model: str = "smollm2-135m-instruct", batch: int = 32, new_tokens: int = 128,
                         prompt_len: int = 32, runs: int = 1, dtype: str = "float32", with_torch: bool = True) -> dict:
    """The greedy decode of `launch.bench sampler` (`batch` random prompts of `prompt_len` tokens, each
    decoding exactly `new_tokens`), profiled on both sides: our prefill + decode segment (two compiled
    modules), transformers' `generate` (its prefill and decode steps). Matmuls with M ≤ 64 are not
    taken for LoRA factors here (`rank_rows` off: M is the batch's rows, and no adapter is loaded)."""
    import numpy as np

    from dart_jax.bench.sampler import _ours_generate, torch_generate
    from dart_jax.checkpoints.registry import load_model
    from dart_jax.models.names import resolve
    from dart_jax.models.transformer import per_layer_params

    path = resolve(model)
    cfg, base = load_model(path, param_dtype=dtype, compute_dtype=dtype)
    base = per_layer_params(base)
    prompt = np.random.default_rng(0).integers(100, cfg.vocab_size, (batch, prompt_len)).astype(np.int32)
    run = _ours_generate(base, cfg, prompt, new_tokens)
    texts = run.compiled_texts()
    run()
    t0 = time.perf_counter()
    tokens = run()
    wall = time.perf_counter() - t0
    vocab = cfg.vocab_size
    out = {"bench": "profile_decode", "model": model, "batch": batch, "new_tokens": new_tokens,
           "prompt_len": prompt_len, "dtype": dtype, "runs": runs, "tokens_decoded": int(np.asarray(tokens).size),
           "dart_jax": {"wall_s": wall, **profile_xla(run, texts, runs, vocab, rank_rows=False)}}
    if with_torch:
        import torch

        from dart_jax.parity.model_check import load_torch_model
        ref = load_torch_model(path).to(getattr(torch, dtype))
        generate = torch_generate(ref, prompt, new_tokens)
        generate()
        t0 = time.perf_counter()
        generate()
        out["transformers"] = {"wall_s": time.perf_counter() - t0,
                               **profile_torch(generate, runs, vocab, rank_rows=False)}
    return out
