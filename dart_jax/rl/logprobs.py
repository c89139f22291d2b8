"""Temperature-scaled token log-probs and entropy, computed in chunks over the sequence.

    z_t = h_t W_out / T                       (logits of position t, divided by the rollout temperature)
    logp_{t+1} = log_softmax(z_t)[x_{t+1}]    (position t predicts token t+1; fp32)
    H_{t+1}   = logsumexp(z_t) − Σ_v softmax(z_t)_v z_{t,v}

Outputs are aligned with the tokens: logp[b, t] is the log-prob of token t (column 0 is 0, no
position predicts it), the same alignment as the trajectory's loss mask and sampler log-probs.

The [B, T, V] logits never exist at once: positions are processed `chunk` at a time inside a
`lax.scan` whose body is rematerialised, so the forward keeps only one [B, chunk, V] block and
the backward recomputes each block from the saved hidden states (what matters at 152k vocab).
"""

from __future__ import annotations

import jax
import jax.numpy as jnp


def _chunk_stats(h: jnp.ndarray, head: jnp.ndarray, targets: jnp.ndarray, inv_temp: float
                 ) -> tuple[jnp.ndarray, jnp.ndarray]:
    """h [B, C, D], head [D, V], targets i32[B, C] -> (logp f32[B, C], entropy f32[B, C])."""
    z = jnp.einsum("bcd,dv->bcv", h, head.astype(h.dtype)).astype(jnp.float32) * inv_temp
    lse = jax.nn.logsumexp(z, axis=-1)
    tgt = jnp.take_along_axis(z, targets[..., None], axis=-1)[..., 0]
    p = jnp.exp(z - lse[..., None])
    entropy = lse - jnp.sum(p * z, axis=-1)
    return tgt - lse, entropy


def token_logprobs(hidden: jnp.ndarray, head: jnp.ndarray, tokens: jnp.ndarray, temperature: float = 1.0,
                   chunk: int = 256) -> tuple[jnp.ndarray, jnp.ndarray]:
    """hidden f32|bf16[B, T, D] (final-normed), head [D, V], tokens i32[B, T] ->
    (logp f32[B, T], entropy f32[B, T]), token-aligned (column 0 is 0)."""
    if temperature <= 0:
        raise ValueError(f"log-prob temperature must be > 0, got {temperature} (greedy rollouts score at T=1)")
    b, t, d = hidden.shape
    h, targets = hidden[:, :-1], tokens[:, 1:]
    n = t - 1
    c = max(1, min(chunk, n))
    pad = (-n) % c
    if pad:
        h = jnp.pad(h, ((0, 0), (0, pad), (0, 0)))
        targets = jnp.pad(targets, ((0, 0), (0, pad)))
    k = (n + pad) // c
    hs = h.reshape(b, k, c, d).swapaxes(0, 1)
    ts = targets.reshape(b, k, c).swapaxes(0, 1)
    inv = 1.0 / float(temperature)

    @jax.checkpoint
    def body(_, xs):
        return None, _chunk_stats(xs[0], head, xs[1], inv)

    _, (lp, ent) = jax.lax.scan(body, None, (hs, ts))
    lp = lp.swapaxes(0, 1).reshape(b, -1)[:, :n]
    ent = ent.swapaxes(0, 1).reshape(b, -1)[:, :n]
    zero = jnp.zeros((b, 1), jnp.float32)
    return jnp.concatenate([zero, lp], axis=1), jnp.concatenate([zero, ent], axis=1)
