"""Create a DART adapter directory for a model: tags added, embedding rows seeded, two adapters
initialised (B = 0, the training start) or perturbed (B ~ N(0, b_std²), for cross-checks, where
B = 0 would hide every bug in the B path)."""

from __future__ import annotations

import jax

from dart_jax.adapters.method import MethodSpec, init_adapters
from dart_jax.checkpoints.dart_io import export_dart
from dart_jax.checkpoints.registry import load_tagged_model


def init_dart_directory(model: str, out_dir: str, spec: MethodSpec = MethodSpec("dart"), seed: int = 0,
                        b_std: float = 0.0, open_tag: str = "<search>", close_tag: str = "</search>") -> str:
    key = jax.random.PRNGKey(seed)
    cfg, base, tok = load_tagged_model(model, jax.random.fold_in(key, 0))
    adapters = init_adapters(spec, cfg, jax.random.fold_in(key, 1))
    if b_std > 0:
        adapters = {
            n: a.replace(params={t: {"a": ab["a"], "b": b_std * jax.random.normal(
                jax.random.fold_in(key, 100 + 10 * i + j), ab["b"].shape, ab["b"].dtype)}
                for j, (t, ab) in enumerate(sorted(a.params.items()))})
            for i, (n, a) in enumerate(sorted(adapters.items()))}
    return export_dart(out_dir, adapters, cfg, base, tok, open_tag, close_tag, base_model=model)
