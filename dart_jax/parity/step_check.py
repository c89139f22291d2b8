"""`launch.crosscheck step`: full jitted GRPO updates (clipping, AdamW, warmup) vs torch.optim.AdamW
+ clip_grad_norm_ + LambdaLR on the batch of `loss_check`, parameters after every update.

The schedule runs on verl's clock: each RL step applies one update per mini-batch (≥ 2), then torch's
LambdaLR steps once, as verl's actor calls lr_scheduler.step() after update_policy; ours reads the
schedule at the RL step the jitted step is given. With warmup 2 the first RL step's updates all have
lr 0 (nothing may move), the second's lr/2."""

from __future__ import annotations

import dataclasses
import time

import jax
import jax.numpy as jnp
import numpy as np

from dart_jax.parity.check_report import (
    TOLERANCES,
    CheckReport,
    Quantity,
    quantity,
    within,
)
from dart_jax.parity.loss_check import (
    MARGIN,
    RESPONSE_LENGTH,
    Setup,
    _old_ref,
    _stack,
    _torch_batch,
    _torch_factors,
    _torch_forward,
    prepare,
)
from dart_jax.rl.advantages import group_index, grpo_advantages
from dart_jax.rl.optim import make_optimizer
from dart_jax.rl.step import BATCH_KEYS, init_state, make_accumulate, make_train_step, sequence_logprobs
from dart_jax.run.spec import LossConfig, OptimConfig


def crosscheck_step(model: str, dtype: str = "float32", lc: LossConfig | None = None,
                    oc: OptimConfig | None = None, rl_steps: int = 3, minibatches: int = 2, micro_batch: int = 2,
                    reference: str = "dart_jax", differences: list | None = None, seed: int = 0,
                    setup: Setup | None = None, response_length: int = RESPONSE_LENGTH) -> CheckReport:
    """`rl_steps` RL steps of `minibatches` AdamW updates each (the batch split into that many
    mini-batches; warmup 2 RL steps, clipping active), parameters after every update."""

    from dart_jax.parity import torch_grpo
    t0 = time.time()
    lc = dataclasses.replace(lc or LossConfig(), norm_length=response_length)
    setup = setup or prepare(model, dtype, seed=seed)
    b, cfg, base = setup.batch, setup.cfg, setup.base
    ads0 = jax.device_get(setup.adapters)
    logp, _ = jax.jit(lambda ads, t, p, r: sequence_logprobs(base, ads, t, p, r, cfg=cfg, temperature=lc.temperature,
                                                             chunk=lc.logprob_chunk))(
        ads0, jnp.asarray(b["tokens"]), jnp.asarray(b["positions"]), jnp.asarray(b["route_ids"]))
    old, ref = _old_ref(np.asarray(logp, np.float32), b["loss_mask"], seed, lc, MARGIN[dtype])
    gid, ng = group_index(b["uids"])
    adv = np.asarray(grpo_advantages(jnp.asarray(b["scores"]), jnp.asarray(gid), ng), np.float32)
    full = dict(b, old_logp=old, ref_logp=ref, advantages=adv)
    n = len(adv)
    if minibatches < 2 or n % minibatches or (n // minibatches) % micro_batch:
        raise ValueError(f"{n} trajectories must split into ≥ 2 mini-batches ({minibatches}) of whole "
                         f"micro-batches ({micro_batch})")
    rows = n // minibatches
    parts = [{k: v[i * rows:(i + 1) * rows] for k, v in full.items() if k in BATCH_KEYS}
             for i in range(minibatches)]
    stacked = [_stack(p, BATCH_KEYS, micro_batch) for p in parts]
    if oc is None:  # clip at half the first gradient norm, so clipping acts
        g, _ = jax.jit(make_accumulate(cfg, setup.method, lc))(ads0, base, stacked[0], jax.random.PRNGKey(0))
        norm = float(np.sqrt(sum(float(jnp.sum(jnp.square(x))) for x in jax.tree.leaves(g))))
        oc = OptimConfig(lr=1e-3, warmup_steps=2, total_steps=10, clip_norm=0.5 * norm)
    opt = make_optimizer(oc)
    step = jax.jit(make_train_step(cfg, setup.method, lc, oc))
    state = init_state(ads0, opt)

    names, factors, scales = _torch_factors(setup)
    params = [t for f in factors for pair in f.values() for t in pair]
    topt, sched = torch_grpo.adamw_with_warmup(params, oc)
    fwd = _torch_forward(setup, factors, scales, lc.temperature)
    tb = _torch_batch(b, old, ref, adv)
    tparts = [{k: v[i * rows:(i + 1) * rows] for k, v in tb.items()} for i in range(minibatches)]
    quantities = []
    start = [p.detach().clone() for p in params]
    lr_total = 0.0
    solid = True
    order = [(s, j) for s in range(rl_steps) for j in range(minibatches)]
    for k, (rl_step, j) in enumerate(order):
        state, metrics = step(state, base, stacked[j], jax.random.PRNGKey(k), rl_step)
        topt.zero_grad()
        loss = torch_grpo.minibatch_loss(fwd, tparts[j], lc, micro_batch, response_length)
        loss.backward()
        gmag = np.concatenate([np.abs(p.grad.numpy()).ravel() for f in factors for pair in f.values() for p in pair])
        lr_k = sched.get_last_lr()[0]  # the lr this update applies
        lr_total += lr_k
        tnorm = torch_grpo.apply_update(params, topt, sched if j == minibatches - 1 else None, oc.clip_norm)
        quantities.append(quantity(f"update {k + 1} (RL step {rl_step + 1}, mini-batch {j + 1}): grad norm before "
                                   "clipping", "loss", float(metrics["grad_norm"]), tnorm, dtype))
        q = Quantity(f"update {k + 1}: learning rate (verl: LambdaLR stepped once per RL step)", "abs",
                     abs(float(metrics["lr"]) - lr_k), lr_k, 1e-9 * max(oc.lr, 1.0), 1e-9 * max(oc.lr, 1.0), False)
        q.passed = q.value <= q.tol_fp32
        quantities.append(q)
        ours, theirs, moved = [], [], []
        for i, name in enumerate(names):
            r = setup.adapters[name].rank
            for (layer, target), (A, B) in factors[i].items():
                pa = np.asarray(state.params[name].params[target]["a"][layer], np.float32).reshape(-1, r).T
                pb = np.asarray(state.params[name].params[target]["b"][layer], np.float32).reshape(r, -1).T
                ours += [pa.ravel(), pb.ravel()]
                theirs += [A.detach().numpy().ravel(), B.detach().numpy().ravel()]
        at = 0
        for f in factors:
            for A, B in f.values():
                moved += [(A.detach() - start[at]).numpy().ravel(), (B.detach() - start[at + 1]).numpy().ravel()]
                at += 2
        ours, theirs, moved = np.concatenate(ours), np.concatenate(theirs), np.concatenate(moved)
        kind, t32, t16 = TOLERANCES["params"]
        diff = float(np.linalg.norm(ours - theirs))
        scale = float(np.linalg.norm(moved))
        if scale == 0.0:  # warmup's first update has lr 0: nothing may move, on either side
            q = Quantity(f"update {k + 1}: parameters (lr 0, must not move)", "abs",
                         float(np.max(np.abs(ours - theirs))), 0.0, 1e-7, 1e-7, False)
            q.passed = q.value <= 1e-7
        else:
            q = Quantity(f"update {k + 1} (lr {lr_k:.1e}): parameters, "
                         "‖θ_ours − θ_torch‖ / ‖θ_torch − θ_0‖", "rel", diff, scale, t32, t16, False)
            q.passed = within(q.value, t32 if dtype == "float32" else t16)
            quantities.append(q)
            # per component, in units of the learning rate spent so far (Adam moves each by ≲ lr). Adam's
            # first steps are sign-like, so a component whose gradient sits at the frameworks' rounding
            # level may move the other way (and keeps that offset): held to the tolerance are the
            # components with |g| > 1e-3 · max |g| at every update so far; the rest are counted.
            kind, t32, t16 = TOLERANCES["params_lr"]
            solid &= gmag > 1e-3 * gmag.max()
            q = Quantity(f"update {k + 1}: parameters with |g| > 1e-3·max|g| at every update so far "
                         f"({int(solid.sum())} of {solid.size}), "
                         "max |θ_ours − θ_torch| / Σ lr", kind, float(np.max(np.abs(ours - theirs)[solid])),
                         lr_total, t32, t16, False)
            q.passed = within(q.value, t32 if dtype == "float32" else t16)
            quantities.append(q)
            q = Quantity(f"update {k + 1}: all parameters, max |θ_ours − θ_torch| / Σ lr (reported)", kind,
                         float(np.max(np.abs(ours - theirs))), lr_total, None, None, True)
        quantities.append(q)
    settings = {"lr": oc.lr, "warmup_steps": oc.warmup_steps, "clip_norm": oc.clip_norm,
                "weight_decay": oc.weight_decay, "betas": [oc.b1, oc.b2], "eps": oc.eps, "rl_steps": rl_steps,
                "minibatches_per_rl_step": minibatches, "schedule_clock": oc.schedule_clock,
                "micro_batch": micro_batch, "agg_mode": lc.agg_mode, "micro_mode": lc.micro_mode, "kl_coef": lc.kl_coef,
                "entropy_coef": lc.entropy_coef}
    return CheckReport("step", model, dtype, reference, settings, list(differences or []), quantities,
                       round(time.time() - t0, 1))
