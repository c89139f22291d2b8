"""The jitted GRPO update: micro-batch gradient accumulation, AdamW, non-finite skip.

One call updates on one mini-batch laid out as [M micro-batches, b rows, T tokens]:

    loss = Σ_m c_m Σ_{b,t} w_{m,b,t} ℓ_{m,b,t}
    ℓ = pg(logp, old_logp, A) − entropy_coef·H + kl_coef·KL(logp, ref_logp)

with w, D from `losses.aggregation_weights` and c_m from `losses.micro_scales`: the (Σ numerator,
Σ count) of the mini-batch is known from the masks before the forward, so the true global token
mean (or verl's per-micro-batch mean) is exact under accumulation. Gradients accumulate in fp32
through a `lax.scan` over micro-batches; a non-finite global norm leaves params and optimiser
state untouched and counts the step in `skipped`.

Mixed precision as verl's FSDP actors: the train state holds fp32 *master* parameters and fp32
AdamW moments; the forward / backward runs on a copy cast to the dtype the tree was built in
(`model.param_dtype` for the full variant, `method.adapter_dtype` for adapters), made inside the
jitted step and sharded like the masters; its gradients accumulate in fp32 and update the masters.
An lr-1e-6 update of a bf16 weight of magnitude 0.1 (ulp ≈ 5e-4) would otherwise round to nothing.

The loss mask already holds CEA's role mask m_t (`trainer.build_batch`), so the denominators count
only the tokens that keep gradient.
"""

from __future__ import annotations

from typing import Any

import flax.struct
import jax
import jax.numpy as jnp
import optax

from dart_jax.adapters.isolation import isolated_loss
from dart_jax.adapters.method import MethodSpec, TwoModels, model_trees, two_model_logprobs
from dart_jax.models import lora as lora_lib, mixlora as mixlora_lib
from dart_jax.models.config import ModelConfig
from dart_jax.models.transformer import hidden_states_and_ffn_stats, output_head, shared_prefix_hidden_states
from dart_jax.rl import losses
from dart_jax.rl.batch import PREFIX_KEYS
from dart_jax.rl.logprobs import token_logprobs
from dart_jax.rl.optim import (
    apply_update,
    clock,
    learning_rate,
    make_optimizer,
)
from dart_jax.run.spec import LossConfig, OptimConfig
from dart_jax.tokenization.sentinels import with_token_rows

BATCH_KEYS = ("tokens", "positions", "route_ids", "loss_roles", "loss_mask", "old_logp", "ref_logp", "advantages")
SFT_KEYS = ("tokens", "positions", "route_ids", "loss_roles", "loss_mask")


@flax.struct.dataclass
class TrainState:
    params: Any          # fp32 masters of the trainable tree (adapters, or the base for the full variant)
    opt_state: Any
    step: jnp.ndarray    # i32: optimiser updates applied
    skipped: jnp.ndarray  # i32: updates skipped for a non-finite gradient norm
    compute_dtypes: tuple = flax.struct.field(pytree_node=False, default=())  # per leaf of params

    def compute_params(self):
        """The trainable tree in its compute dtypes (what forwards, rollouts and exports use)."""
        if not self.compute_dtypes:
            return self.params
        leaves, tree = jax.tree_util.tree_flatten(self.params)
        return jax.tree_util.tree_unflatten(tree, [x if x.dtype == d else x.astype(d)
                                                   for x, d in zip(leaves, self.compute_dtypes)])


def _is_float(x) -> bool:
    return jnp.issubdtype(x.dtype, jnp.floating)


def init_state(params, optimizer: optax.GradientTransformation) -> TrainState:
    """A fresh state whose masters are `params` in fp32; the dtypes `params` arrive in are the compute
    dtypes (a bf16 base or bf16 adapters train through fp32 masters)."""
    dtypes = tuple(str(x.dtype) for x in jax.tree.leaves(params))
    masters = jax.tree.map(lambda x: x.astype(jnp.float32) if _is_float(x) else x, params)
    return TrainState(masters, optimizer.init(masters), jnp.zeros((), jnp.int32), jnp.zeros((), jnp.int32),
                      dtypes)


def sequence_logprobs(base, adapters, tokens, positions, route_ids, *, cfg: ModelConfig, temperature: float,
                      chunk: int, residual: str = "recompute") -> tuple[jnp.ndarray, jnp.ndarray]:
    """Teacher-forced (logp, entropy) f32[B, T], token-aligned, at the rollout temperature; `residual`:
    what their backward starts from (rl.logprobs)."""
    logp, ent, _ = sequence_logprobs_and_gate_stats(base, adapters, tokens, positions, route_ids, cfg=cfg,
                                                    temperature=temperature, chunk=chunk, residual=residual)
    return logp, ent


def sequence_logprobs_and_gate_stats(base, adapters, tokens, positions, route_ids, *, cfg: ModelConfig,
                                     temperature: float, chunk: int, prefix=None, residual: str = "recompute"):
    """(logp, entropy, MixLoRA gate statistics or None): see `sequence_logprobs`. With `base` a
    TwoModels (2-Agent), `route_ids` are ψ's roles and token t takes the log-prob of the model that
    wrote it (adapters.method.two_model_logprobs).
    `prefix`: (tokens, positions, route_ids) [1, P] that every row continues (the rows then hold
    only their continuations: rl.batch.split_shared_prefix); column 0's log-prob is 0 as always."""
    if prefix is not None:
        if isinstance(base, TwoModels):
            raise ValueError("a shared-prefix forward does not support the 2-Agent composition (train.share_prefix)")
        h = shared_prefix_hidden_states(base, adapters, prefix, tokens, positions, route_ids, cfg=cfg)
        logp, ent = token_logprobs(h, output_head(base, cfg), tokens, temperature, chunk, residual)
        return logp, ent, None
    if isinstance(base, TwoModels):
        logp, ent = two_model_logprobs(base, route_ids, lambda b, a, r: sequence_logprobs(
            b, a, tokens, positions, r, cfg=cfg, temperature=temperature, chunk=chunk, residual=residual))
        return logp, ent, None
    h, _, stats = hidden_states_and_ffn_stats(base, adapters, tokens, positions, route_ids, None, cfg=cfg)
    logp, ent = token_logprobs(h, output_head(base, cfg), tokens, temperature, chunk, residual)
    return logp, ent, stats


def batch_keys(lc: LossConfig) -> tuple[str, ...]:
    return SFT_KEYS if lc.objective == "sft" else BATCH_KEYS


def metric_keys(lc: LossConfig, router_aux: bool = False) -> tuple[str, ...]:
    extra = ("router_aux",) if router_aux else ()
    if lc.objective == "sft":
        return ("loss", "nll", "entropy") + extra
    return ("loss", "pg_loss", "kl", "entropy", "pg_clipfrac", "pg_clipfrac_lower", "ppo_kl") + extra


def per_token_terms(base, adapters, mb: dict, *, cfg: ModelConfig, lc: LossConfig,
                    router_aux_coef: float = 0.0) -> tuple[jnp.ndarray, dict]:
    """ℓ f32[b, T] and per-token metric values for one micro-batch, 0 outside the loss mask.

    With MixLoRA experts in `adapters`, the micro-batch's load-balancing loss (models.mixlora, over
    all its real tokens and layers, × `router_aux_coef`) is added to ℓ at every loss token, so the
    aggregation weights w (Σ_t w_t ℓ_t) weight it exactly as they weight the policy loss: the
    mini-batch's aux term is the aggregation-weighted mean of its micro-batches' (metric
    "router_aux").

    Inputs are masked *before* they are used (as verl zeroes values outside the mask): an old /
    reference log-prob or an advantage that is NaN or ±inf where the mask is 0 (padding,
    observations, a dropped prompt's rows) must not poison the sum — 0·NaN is NaN — nor its
    gradient, which would reach the masked position through exp / clip even with a zero cotangent."""
    prefix = tuple(mb[k] for k in PREFIX_KEYS) if PREFIX_KEYS[0] in mb else None  # [1, P] each
    logp, ent, gate = sequence_logprobs_and_gate_stats(base, adapters, mb["tokens"], mb["positions"],
                                                       mb["route_ids"], cfg=cfg, temperature=lc.temperature,
                                                       chunk=lc.logprob_chunk, prefix=prefix,
                                                       residual=lc.logprob_residual)
    keep = mb["loss_mask"] > 0
    masked = lambda v: jnp.where(keep, v, 0.0)  # noqa: E731
    aux = {}
    if gate is not None:
        aux = {"router_aux": jnp.broadcast_to(mixlora_lib.load_balancing_loss(gate, router_aux_coef), keep.shape)}
    if lc.objective == "sft":
        # supervised warm start: ℓ_t = −log p(token_t); observation tokens carry loss_mask 0 exactly as in RL
        nll = masked(-logp)
        if aux:
            return masked(-logp + aux["router_aux"]), {"nll": nll, "entropy": masked(ent),
                                                       "router_aux": masked(aux["router_aux"])}
        return nll, {"nll": nll, "entropy": masked(ent)}
    safe = jax.lax.stop_gradient(logp)  # a finite stand-in at masked positions
    old = jnp.where(keep, mb["old_logp"], safe)
    ref = jnp.where(keep, mb["ref_logp"], safe)
    adv = jnp.where(keep, mb["advantages"][:, None], 0.0)
    pg, ind = losses.clipped_policy_loss(logp, old, adv, lc.clip_low, lc.clip_high, lc.dual_clip)
    kl = losses.kl_penalty(logp, ref, lc.kl_type, lc.kl_clamp)
    loss = pg
    if lc.kl_coef:
        loss = loss + lc.kl_coef * kl
    if lc.entropy_coef:  # a zero coefficient must not pull a backward pass through the entropy
        loss = loss - lc.entropy_coef * ent
    if aux:
        loss = loss + aux["router_aux"]
    return masked(loss), {"pg_loss": masked(pg), "kl": masked(kl), "entropy": masked(ent),
                          "pg_clipfrac": masked(ind["clipped"]), "pg_clipfrac_lower": masked(ind["clipped_lower"]),
                          "ppo_kl": masked(ind["ppo_kl"]), **{k: masked(v) for k, v in aux.items()}}


def policy_trees(method: MethodSpec, params, base, row_ids: tuple[int, ...] = ()):
    """(base, adapters) of the forward pass. With `row_ids` the trainable tree is
    {"adapters": ..., "rows": {"embed"[, "lm_head"]}}: the rows of those tokens (the added tags)
    train too and are written into the base first."""
    if row_ids:
        base = with_token_rows(base, row_ids, params["rows"])
        params = params["adapters"]
    return model_trees(method, params, base, None)


def make_accumulate(cfg: ModelConfig, method: MethodSpec, lc: LossConfig, row_ids: tuple[int, ...] = ()):
    """-> accumulate(params, base, batch, key) -> (grads fp32 like params, metric sums): the gradient
    of one mini-batch's loss with micro-batch accumulation — what the train step applies, and what
    `launch.crosscheck loss` compares against PyTorch."""

    def micro_loss(params, base, mb, scale, key):
        base_, ads = policy_trees(method, params, base, row_ids)

        def per_token(adapters):
            return per_token_terms(base_, lora_lib.with_dropout(adapters, key), mb, cfg=cfg, lc=lc,
                                   router_aux_coef=method.router_aux_coef)

        w, _ = losses.aggregation_weights(mb["loss_mask"], lc.agg_mode, lc.norm_length)
        w = w * scale
        if ads is None or method.isolation == "forward":
            loss, terms = per_token(ads)
            total = jnp.sum(w * loss)
        else:
            total, terms = isolated_loss(per_token, ads, w, mb["loss_roles"], method.isolation, has_aux=True)
        metrics = {k: jnp.sum(w * jax.lax.stop_gradient(v)) for k, v in terms.items()}
        metrics["loss"] = jax.lax.stop_gradient(total)
        return total, metrics

    grad_fn = jax.value_and_grad(micro_loss, has_aux=True)

    def add_micro(carry, params, base, mb, scale, key, i):
        """carry (grads fp32, metric sums) + micro-batch i's gradient and metrics (key folded with i)."""
        grads, sums = carry
        (_, metrics), g = grad_fn(params, base, mb, scale, jax.random.fold_in(key, i))
        return (jax.tree.map(lambda a, b: a + b.astype(jnp.float32), grads, g), jax.tree.map(jnp.add, sums, metrics))

    def accumulate(params, base, batch: dict, key: jax.Array):
        scales = micro_scales(lc, batch["loss_mask"])
        n_micro = batch["tokens"].shape[0]

        def body(carry, xs):
            mb, scale, i = xs
            return add_micro(carry, params, base, mb, scale, key, i), None

        carry0 = zero_carry(lc, method, params)
        if n_micro == 1:  # no loop: lets XLA schedule the single micro-batch freely
            (grads, sums), _ = body(carry0, (jax.tree.map(lambda v: v[0], batch), scales[0], 0))
        else:
            (grads, sums), _ = jax.lax.scan(body, carry0, (batch, scales, jnp.arange(n_micro)))
        return grads, sums

    accumulate.add_micro = add_micro  # one micro-batch at a time (make_micro_step)
    return accumulate


def micro_scales(lc: LossConfig, loss_mask) -> jnp.ndarray:
    """f32[M]: each micro-batch's c_m (losses.micro_scales) from the mini-batch's loss mask [M, b, T]."""
    denominators = jax.vmap(lambda m: losses.aggregation_weights(m, lc.agg_mode, lc.norm_length)[1])(loss_mask)
    return losses.micro_scales(denominators, lc.micro_mode)


def zero_carry(lc: LossConfig, method: MethodSpec, params) -> tuple[Any, dict]:
    """(zero fp32 gradients like params, zero metric sums): where accumulation starts."""
    return (jax.tree.map(lambda p: jnp.zeros(p.shape, jnp.float32), params),
            {k: jnp.zeros((), jnp.float32) for k in metric_keys(lc, method.gate_aux)})


def make_train_step(cfg: ModelConfig, method: MethodSpec, lc: LossConfig, oc: OptimConfig,
                    row_ids: tuple[int, ...] = ()):
    """-> step(state, base, batch, key, rl_step) -> (state, metrics). `base` is the frozen base (the
    reference policy for the full variant); `batch` holds BATCH_KEYS, each [M, b, ...]; `rl_step`
    (i32 scalar) is the RL step the update belongs to — the schedule's clock by default (see
    optim.py); `row_ids`: see `policy_trees`. The state comes from `init_state(params,
    make_optimizer(oc))`."""
    accumulate = make_accumulate(cfg, method, lc, row_ids)
    apply = make_apply(oc)

    def step(state: TrainState, base, batch: dict, key: jax.Array, rl_step) -> tuple[TrainState, dict]:
        grads, sums = accumulate(state.compute_params(), base, batch, key)  # fp32, like the masters
        return apply(state, grads, sums, jnp.sum(batch["loss_mask"]), rl_step)

    return step


def make_micro_step(cfg: ModelConfig, method: MethodSpec, lc: LossConfig, oc: OptimConfig,
                    row_ids: tuple[int, ...] = ()):
    """`make_train_step` cut into calls, for micro-batches of their own shapes (`train.micro_batch_padding
    = "own"`: each padded to its own longest row, not the mini-batch's): -> (start, add, finish) with
    start(state, loss_mask [M, b, T]) -> (each micro-batch's scale c_m f32[M] from the whole mini-batch's
    mask before any cut, the zero carry: fp32 gradients and metric sums); add(carry, params, base, mb,
    scale, key, i) -> the carry with micro-batch i ({key: [1, b, ...]}) added, `params` the state's
    `compute_params()` (cast once for the mini-batch, not once per micro-batch); finish(state, carry,
    loss_tokens, rl_step) -> (state, metrics), AdamW or the non-finite skip. The same sums in the same
    order as the scan of `make_train_step`; only the padding differs, so the result equals it to
    rounding (reductions over another width)."""
    accumulate = make_accumulate(cfg, method, lc, row_ids)
    apply = make_apply(oc)

    def start(state: TrainState, loss_mask):
        return micro_scales(lc, loss_mask), zero_carry(lc, method, state.params)

    def add(carry, params, base, mb: dict, scale, key: jax.Array, i):
        return accumulate.add_micro(carry, params, base, jax.tree.map(lambda v: v[0], mb), scale, key, i)

    def finish(state: TrainState, carry, loss_tokens, rl_step):
        return apply(state, *carry, loss_tokens, rl_step)

    return start, add, finish


def make_apply(oc: OptimConfig):
    """-> apply(state, grads, sums, loss_tokens, rl_step) -> (state, metrics): AdamW on the accumulated
    fp32 gradients, or nothing (the step counted in `skipped`) when their global norm is not finite."""
    optimizer, schedule = make_optimizer(oc), learning_rate(oc)

    def apply(state: TrainState, grads, sums: dict, loss_tokens, rl_step) -> tuple[TrainState, dict]:
        gnorm = optax.global_norm(grads)
        finite = jnp.isfinite(gnorm)
        direction, new_opt = optimizer.update(grads, state.opt_state, state.params)
        lr = schedule(clock(oc, rl_step, state.step))
        new_params = apply_update(state.params, direction, lr)
        keep = lambda new, old: jax.tree.map(lambda a, b: jnp.where(finite, a, b), new, old)  # noqa: E731
        new_state = TrainState(keep(new_params, state.params), keep(new_opt, state.opt_state),
                               state.step + finite.astype(jnp.int32), state.skipped + (~finite).astype(jnp.int32),
                               state.compute_dtypes)
        metrics = dict(sums, grad_norm=gnorm, skipped=(~finite).astype(jnp.float32),
                       loss_tokens=jnp.asarray(loss_tokens, jnp.float32), lr=jnp.asarray(lr, jnp.float32))
        return new_state, metrics

    return apply


def make_scorer(cfg: ModelConfig, temperature: float, chunk: int):
    """-> score(base, adapters, tokens, positions, route_ids) -> logp f32[B, T] (no gradient):
    the old-policy and reference log-probs."""

    def score(base, adapters, tokens, positions, route_ids):
        logp, _ = sequence_logprobs(base, adapters, tokens, positions, route_ids, cfg=cfg,
                                    temperature=temperature, chunk=chunk)
        return logp

    return score
