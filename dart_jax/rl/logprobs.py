"""Temperature-scaled token log-probs and entropy, computed in chunks over the sequence.

    z_t = h_t W_out / T                       (logits of position t, divided by the rollout temperature)
    logp_{t+1} = log_softmax(z_t)[x_{t+1}]    (position t predicts token t+1; fp32)
    H_{t+1}   = logsumexp(z_t) − Σ_v softmax(z_t)_v z_{t,v}

Outputs are aligned with the tokens: logp[b, t] is the log-prob of token t (column 0 is 0, no
position predicts it), the same alignment as the trajectory's loss mask and sampler log-probs.

The [B, T, V] logits never exist at once in the forward: positions are processed `chunk` at a
time inside a `lax.scan`. The gradient is written by hand (`jax.custom_vjp`), one fused pass per
chunk: with p = softmax(z) and S = Σ p z = lse − H,

    ∂logp/∂z = onehot(target) − p        ∂H/∂z = −p ⊙ (z − S)

so dz = g_logp (onehot − p) − g_H p (z − S), then dh = dz W_outᵀ / T and dW_out = hᵀ dz / T.
`residual` chooses what the backward starts from:
    "recompute"  the chunk's hidden states and its lse, H (a few floats per position): the
                 backward recomputes z = h W_out (one head matmul); the default, memory ∝ B·T·D
    "logits"     the fp32 logits z of every chunk (B·T·V·4 bytes, 400 MB at 4×512 and 49k vocab):
                 no recomputed matmul — faster where the logits fit (launch.bench options)
    "autodiff"   no hand-written gradient: JAX differentiates the chunk, rematerialised
                 (`jax.checkpoint`) — the reference the other two are tested against
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp

from dart_jax.models import dots
from dart_jax.run.spec import LOGPROB_RESIDUALS as RESIDUALS


def _logits(h, head, inv_temp):
    return dots.einsum("bcd,dv->bcv", h, head.astype(h.dtype)).astype(jnp.float32) * inv_temp


def _stats(z, targets):
    """(logp, entropy, lse) of logits z [B, C, V]: one exp pass over the logits (Σ e and Σ e·z with
    e = exp(z − max), reduced together), not one per statistic."""
    m = jax.lax.stop_gradient(jnp.max(z, axis=-1, keepdims=True))
    e = jnp.exp(z - m)
    den = jnp.sum(e, axis=-1)
    lse = m[..., 0] + jnp.log(den)
    tgt = jnp.take_along_axis(z, targets[..., None], axis=-1)[..., 0]
    ent = lse - jnp.sum(e * z, axis=-1) / den
    return tgt - lse, ent, lse


@functools.partial(jax.custom_vjp, nondiff_argnums=(3, 4))
def _chunk_stats(h, head, targets, inv_temp: float, residual: str):
    """h [B, C, D], head [D, V], targets i32[B, C] -> (logp f32[B, C], entropy f32[B, C])."""
    lp, ent, _ = _stats(_logits(h, head, inv_temp), targets)
    return lp, ent


def _chunk_fwd(h, head, targets, inv_temp, residual):
    z = _logits(h, head, inv_temp)
    lp, ent, lse = _stats(z, targets)
    return (lp, ent), (h, head, targets, z if residual == "logits" else None, lse, ent)


def _chunk_bwd(inv_temp, residual, res, g):
    h, head, targets, z, lse, ent = res
    g_lp, g_ent = g
    if z is None:
        z = _logits(h, head, inv_temp)
    p = jnp.exp(z - lse[..., None])
    onehot = jnp.arange(z.shape[-1], dtype=targets.dtype) == targets[..., None]
    dz = (g_lp[..., None] * (onehot.astype(jnp.float32) - p)
          - g_ent[..., None] * p * (z - (lse - ent)[..., None])) * inv_temp
    dz = dz.astype(h.dtype)
    dh = jnp.einsum("bcv,dv->bcd", dz, head.astype(h.dtype)).astype(h.dtype)
    dhead = jnp.einsum("bcd,bcv->dv", h, dz).astype(head.dtype)
    return dh, dhead, None


_chunk_stats.defvjp(_chunk_fwd, _chunk_bwd)


def token_logprobs(hidden: jnp.ndarray, head: jnp.ndarray, tokens: jnp.ndarray, temperature: float = 1.0,
                   chunk: int = 256, residual: str = "recompute") -> tuple[jnp.ndarray, jnp.ndarray]:
    """hidden f32|bf16[B, T, D] (final-normed), head [D, V], tokens i32[B, T] ->
    (logp f32[B, T], entropy f32[B, T]), token-aligned (column 0 is 0). `residual`: see the module."""
    if temperature <= 0:
        raise ValueError(f"log-prob temperature must be > 0, got {temperature} (greedy rollouts score at T=1)")
    if residual not in RESIDUALS:
        raise ValueError(f"log-prob residual {residual!r}; expected one of {RESIDUALS}")
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

    if residual == "autodiff":
        @jax.checkpoint
        def body(_, xs):
            return None, _stats(_logits(xs[0], head, inv), xs[1])[:2]
    else:
        def body(_, xs):
            return None, _chunk_stats(xs[0], head, xs[1], inv, residual)

    _, (lp, ent) = jax.lax.scan(body, None, (hs, ts))
    lp = lp.swapaxes(0, 1).reshape(b, -1)[:, :n]
    ent = ent.swapaxes(0, 1).reshape(b, -1)[:, :n]
    zero = jnp.zeros((b, 1), jnp.float32)
    return jnp.concatenate([zero, lp], axis=1), jnp.concatenate([zero, ent], axis=1)
