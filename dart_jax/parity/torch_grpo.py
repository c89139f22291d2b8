"""PyTorch reference of the GRPO update (verl's conventions, listed below), written from those
conventions alone.

Nothing here imports dart_jax's JAX code: it is the independent side of `launch.crosscheck loss`
and `launch.crosscheck step` (and of tests/rl). Conventions, each switchable as the reference
systems differ:

    log-probs   z = logits / T; shift by one; log_softmax in fp32; gather.  H = logsumexp(z) − Σ softmax(z)·z
    advantage   A_i = (s_i − mean_g) / (std_g + 1e-6), unbiased std; a group of one: mean 0, std 1;
                norm_by_std=False: s_i − mean_g
    KL          k1 = d, abs = |d|, k2 = ½d², k3 = clamp(e^u − u − 1, −10, 10), u = clamp(ref − logp, ±20)
                (kl_clamp=False: no clamps, Search-R1's older verl)
    clip loss   Δ = clamp(logp − old, ±20); ratio = e^Δ;
                Lclip = max(−A·ratio, −A·clamp(ratio, 1−εl, 1+εh));
                ℓ = min(−A·c, Lclip) where A < 0 (dual clip c), else Lclip
    aggregation token-mean, seq-mean-token-sum, seq-mean-token-mean, seq-mean-token-sum-norm (Σ m·ℓ / L
                with L the configured maximum response length: verl pads every response to it and
                divides by that width, whatever the batch's own widths); micro-batches by a true
                global token mean (SkyRL) or verl's per-micro-batch mean / M
    optimiser   torch.optim.AdamW after clip_grad_norm_, linear warmup from 0 (LambdaLR)
"""

from __future__ import annotations

import math

import torch


def logprobs_entropy(logits: torch.Tensor, ids: torch.Tensor, temperature: float = 1.0):
    """logits [B, T, V] (position t predicts t+1), ids [B, T] -> token-aligned (logp, entropy) [B, T]
    with column 0 = 0 (the first token has no prediction)."""
    z = logits[:, :-1].float() / temperature
    logp_all = torch.log_softmax(z, -1)
    logp = logp_all.gather(-1, ids[:, 1:, None].long())[..., 0]
    ent = torch.logsumexp(z, -1) - (torch.softmax(z, -1) * z).sum(-1)
    pad = torch.zeros_like(logp[:, :1])
    return torch.cat([pad, logp], 1), torch.cat([pad, ent], 1)


def grpo_advantages(scores: torch.Tensor, uids: list, norm_by_std: bool = True, eps: float = 1e-6) -> torch.Tensor:
    scores = scores.double()
    out = torch.empty_like(scores)
    for u in dict.fromkeys(uids):
        idx = torch.tensor([i for i, v in enumerate(uids) if v == u])
        s = scores[idx]
        if len(idx) == 1:
            mean, std = torch.zeros(()), torch.ones(())
        else:
            mean, std = s.mean(), s.std(unbiased=True)
        out[idx] = (s - mean) / (std + eps) if norm_by_std else s - mean
    return out.float()


def kl_penalty(logp, ref_logp, kind: str = "k3", clamp: bool = True):
    d = logp - ref_logp
    if kind == "k1":
        return d
    if kind == "abs":
        return d.abs()
    if kind == "k2":
        return 0.5 * d * d
    if kind == "k3":
        u = ref_logp - logp
        if clamp:
            u = torch.clamp(u, -20, 20)
        kl = torch.exp(u) - u - 1
        return torch.clamp(kl, -10, 10) if clamp else kl
    raise ValueError(kind)


def policy_loss(logp, old_logp, adv, clip_low=0.2, clip_high=0.2, dual_clip: float | None = 3.0):
    """-> (ℓ, ratio, clipped, clipped_lower), all [B, T]; adv [B, 1] or [B, T]."""
    delta = torch.clamp(logp - old_logp, -20, 20)
    ratio = torch.exp(delta)
    l1 = -adv * ratio
    l2 = -adv * torch.clamp(ratio, 1 - clip_low, 1 + clip_high)
    lclip = torch.maximum(l1, l2)
    if dual_clip is None:
        return lclip, ratio, (l2 > l1).float(), torch.zeros_like(lclip)
    l3 = -adv * dual_clip
    loss = torch.where(adv < 0, torch.minimum(l3, lclip), lclip)
    lower = ((lclip > l3) & (adv < 0)).float()
    return loss, ratio, (l2 > l1).float(), lower


def aggregate(values, mask, mode: str = "token-mean", response_length: int | None = None):
    """verl's loss aggregation over one batch (0 when no token carries loss). `response_length`: the configured
    maximum response length, seq-mean-token-sum-norm's L (required there)."""
    mask = mask.float()
    row = mask.sum(-1)
    nonempty = row > 0
    if mode == "token-mean":
        return (values * mask).sum() / mask.sum() if mask.sum() > 0 else values.sum() * 0
    if mode == "seq-mean-token-sum":
        sums = (values * mask).sum(-1)
        return sums[nonempty].mean() if nonempty.any() else values.sum() * 0
    if mode == "seq-mean-token-mean":
        means = (values * mask).sum(-1) / row.clamp(min=1)
        return means[nonempty].mean() if nonempty.any() else values.sum() * 0
    if mode == "seq-mean-token-sum-norm":
        if not response_length:
            raise ValueError("seq-mean-token-sum-norm needs the configured maximum response length")
        return (values * mask).sum() / response_length
    raise ValueError(mode)


def micro_loss_terms(logp, ent, batch: dict, lc) -> dict:
    """Per-token terms of one (micro-)batch: pg, kl, entropy, ratio, indicators."""
    pg, ratio, clipped, lower = policy_loss(logp, batch["old_logp"], batch["advantages"][:, None], lc.clip_low,
                                            lc.clip_high, lc.dual_clip)
    kl = kl_penalty(logp, batch["ref_logp"], lc.kl_type, lc.kl_clamp)
    return {"pg": pg, "kl": kl, "entropy": ent, "ratio": ratio, "clipped": clipped, "clipped_lower": lower,
            "ppo_kl": -torch.clamp(logp - batch["old_logp"], -20, 20)}


def total_loss(terms: dict, mask, lc, response_length: int | None = None) -> torch.Tensor:
    loss = aggregate(terms["pg"], mask, lc.agg_mode, response_length)
    if lc.kl_coef:
        loss = loss + lc.kl_coef * aggregate(terms["kl"], mask, lc.agg_mode, response_length)
    if lc.entropy_coef:
        loss = loss - lc.entropy_coef * aggregate(terms["entropy"], mask, lc.agg_mode, response_length)
    return loss


def minibatch_loss(forward_logp, batch: dict, lc, micro_batch: int, response_length: int | None = None
                   ) -> torch.Tensor:
    """The loss whose gradient one update applies, with gradient accumulation over micro-batches:
    `global` = the aggregate over the whole mini-batch (SkyRL's true token mean), written as each
    micro-batch's Σ w·ℓ over the mini-batch's denominator; `verl_microbatch_mean` = Σ_m agg_m / M.
    seq-mean-token-sum-norm divides each micro-batch by L = `response_length` and the accumulation by
    M, as verl does, in both modes (so the global form is Σ / (M·L), not Σ / L)."""
    n = batch["tokens"].shape[0]
    chunks = [slice(s, s + micro_batch) for s in range(0, n, micro_batch)]
    if lc.micro_mode == "verl_microbatch_mean" or lc.agg_mode == "seq-mean-token-sum-norm":
        out = 0.0
        for sl in chunks:
            mb = {k: v[sl] for k, v in batch.items()}
            logp, ent = forward_logp(mb)
            out = out + total_loss(micro_loss_terms(logp, ent, mb, lc), mb["loss_mask"], lc,
                                   response_length) / len(chunks)
        return out
    # global: one forward per micro-batch, the aggregate taken over the concatenation
    logps, ents = zip(*(forward_logp({k: v[sl] for k, v in batch.items()}) for sl in chunks))
    width = max(x.shape[1] for x in logps)
    pad = lambda xs: torch.cat([torch.nn.functional.pad(x, (0, width - x.shape[1])) for x in xs])  # noqa: E731
    logp, ent = pad(logps), pad(ents)
    return total_loss(micro_loss_terms(logp, ent, batch, lc), batch["loss_mask"], lc)


def adamw_with_warmup(params, oc):
    """torch.optim.AdamW + LambdaLR linear warmup from 0 (verl: the first update has lr 0)."""
    opt = torch.optim.AdamW(params, lr=oc.lr, betas=(oc.b1, oc.b2), eps=oc.eps, weight_decay=oc.weight_decay)
    warm = int(oc.warmup_steps)

    def factor(k):
        if k < warm:
            return k / warm
        if getattr(oc, "schedule", "constant") == "cosine":
            total = max(int(oc.total_steps) - warm, 1)
            prog = min((k - warm) / total, 1.0)
            return oc.min_lr_ratio + (1 - oc.min_lr_ratio) * 0.5 * (1 + math.cos(math.pi * prog))
        return 1.0

    return opt, torch.optim.lr_scheduler.LambdaLR(opt, factor)


def apply_update(params, opt, sched, clip_norm: float | None) -> float:
    """clip_grad_norm_ (global), then AdamW, then the schedule's next lr (`sched` None: the caller
    steps it, e.g. once per RL step as verl does); -> the gradient norm."""
    if clip_norm is None:
        norm = torch.sqrt(sum((p.grad.double() ** 2).sum() for p in params))
    else:
        norm = torch.nn.utils.clip_grad_norm_(params, clip_norm)
    if not torch.isfinite(norm):  # a non-finite gradient skips the step
        return float(norm)
    opt.step()
    if sched is not None:
        sched.step()
    return float(norm)
