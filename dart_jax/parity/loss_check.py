"""`launch.crosscheck loss` and `launch.crosscheck step`: one identical GRPO trajectory batch through
dart_jax and through PyTorch (transformers + the routed-LoRA hooks of `torch_lora` + the loss of
`torch_grpo`, written from verl's conventions without our JAX code), quantity by quantity.

The batch: Search-R1-protocol trajectories (prompt, written pieces, retrieved observation with loss
mask 0) for two questions × two samples, routed by ψ; old / reference log-probs are the current
policy's plus fixed noise large enough that clipping, the dual clip and the KL term all act. DART
adapters with B ~ N(0, 0.02²) (B = 0 would hide every bug on the B path).

loss: advantages, per-token log-probs / entropy / ratio, the pg loss, KL and entropy aggregates in
every aggregation mode, the total loss, and the gradients w.r.t. the trainable tree in every mode
(and in the other micro-batch mode) — the gradient is the train step's own accumulation.
The step check (`step_check.py`) runs full updates on the same batch; the report primitives live in
`report.py`.
"""

from __future__ import annotations

import dataclasses
import time
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from dart_jax.adapters.method import MethodSpec, init_adapters
from dart_jax.parity.check_report import (
    TOLERANCES,
    CheckReport,
    Quantity,
    metric,
    quantity,
)
from dart_jax.rl.advantages import group_index, grpo_advantages
from dart_jax.rl.batch import token_arrays
from dart_jax.rl.losses import AGG_MODES, aggregate, clipped_policy_loss, kl_penalty
from dart_jax.rl.step import BATCH_KEYS, make_accumulate, sequence_logprobs
from dart_jax.run.spec import LossConfig
from dart_jax.tokenization.sentinels import router_for_tags
from dart_jax.tokenization.tokenizer import encode_chat

# distance kept between a token's ratio and a clip boundary (relative), per dtype
MARGIN = {"float32": 1e-3, "bfloat16": 5e-2}
# seq-mean-token-sum-norm's L on both sides: the configured maximum response length (configs/base.py's
# rollout.max_response_tokens, the paper's 4,096), never the width of the batch's arrays
RESPONSE_LENGTH = 4096

QUESTIONS = [
    ("who wrote the novel war and peace?",
     [[("<think>I need the author.</think>\n<search> war and peace author </search>", 1),
       ("\n\n<information>Doc 1(Title: \"War and Peace\") War and Peace is a novel by the Russian author Leo "
        "Tolstoy, published serially.</information>\n\n", 0),
       ("<think>The passage names Tolstoy.</think>\n<answer> Leo Tolstoy </answer>", 1)],
      [("<think>I know this one.</think>\n<answer> Fyodor Dostoevsky </answer>", 1)]], [1.0, 0.0]),
    ("what is the capital of australia?",
     [[("<think>Let me check.</think>\n<search> capital city of australia </search>", 1),
       ("\n\n<information>Doc 1(Title: \"Canberra\") Canberra is the capital city of Australia, in the "
        "Australian Capital Territory.</information>\n\n", 0),
       ("<think>Canberra.</think>\n<answer> Canberra </answer>", 1)],
      [("<think>Search first.</think>\n<search> australia capital </search>", 1),
       ("\n\n<information>Doc 1(Title: \"Sydney\") Sydney is the largest city in Australia.</information>\n\n", 0),
       ("<think>Sydney.</think>\n<answer> Sydney </answer>", 1)]], [1.0, 0.0]),
]


# -- the shared inputs --------------------------------------------------------------------------------------
@dataclasses.dataclass
class Setup:
    cfg: Any
    base: Any
    tok: Any
    adapters: dict
    method: MethodSpec
    batch: dict          # numpy arrays [N, T] (+ scores, uids)
    torch_model: Any
    dtype: str


def _trajectories(tok, router, method) -> dict:
    from dart_jax.data.prompts import qa_prompt
    rows, uids, scores = [], [], []
    for q, (question, samples, score) in enumerate(QUESTIONS):
        prompt = encode_chat(tok, [{"role": "user", "content": qa_prompt(question)}])
        for pieces, s in zip(samples, score):
            ids, mask = list(prompt), [0.0] * len(prompt)
            for text, loss in pieces:
                piece = tok.encode(text, add_special_tokens=False)
                ids += piece
                mask += [float(loss)] * len(piece)
            rows.append((ids, mask))
            uids.append(f"q{q}")
            scores.append(s)
    width = max(len(i) for i, _ in rows)
    ids = np.zeros((len(rows), width), np.int32)
    pos = np.full((len(rows), width), -1, np.int32)
    mask = np.zeros((len(rows), width), np.float32)
    for r, (i, m) in enumerate(rows):
        ids[r, :len(i)], pos[r, :len(i)], mask[r, :len(m)] = i, np.arange(len(i)), m
    out = token_arrays(ids, pos, mask, method, router, pad_multiple=16)
    out["scores"] = np.asarray(scores, np.float32)
    out["uids"] = uids
    return out


def _torch_model(path: str, cfg, base, dtype: str):
    import torch

    from dart_jax.parity.model_check import load_torch_model
    model = load_torch_model(path)
    model.resize_token_embeddings(cfg.vocab_size, mean_resizing=False)
    with torch.no_grad():
        model.get_input_embeddings().weight.copy_(torch.tensor(np.asarray(base["embed"], np.float32)))
        if not cfg.tie_word_embeddings:
            model.get_output_embeddings().weight.copy_(torch.tensor(np.asarray(base["lm_head"], np.float32).T))
    if dtype == "bfloat16":
        model = model.to(torch.bfloat16)
    for p in model.parameters():
        p.requires_grad_(False)
    return model


def prepare(model: str, dtype: str = "float32", rank: int = 8, b_std: float = 0.02, seed: int = 0) -> Setup:
    from dart_jax.checkpoints.registry import load_tagged_model
    from dart_jax.models.names import resolve
    if dtype not in ("float32", "bfloat16"):
        raise ValueError(f"dtype {dtype!r}; expected float32 or bfloat16")
    path = resolve(model)
    key = jax.random.PRNGKey(seed)
    cfg, base, tok = load_tagged_model(path, jax.random.fold_in(key, 0), param_dtype=dtype, compute_dtype=dtype,
                                       remat_policy="none")
    method = MethodSpec("dart", rank=rank, alpha=2.0 * rank)
    adapters = init_adapters(method, cfg, jax.random.fold_in(key, 1))
    adapters = {n: a.replace(params={t: {"a": ab["a"], "b": b_std * jax.random.normal(
        jax.random.fold_in(key, 100 + 10 * i + j), ab["b"].shape, ab["b"].dtype)}
        for j, (t, ab) in enumerate(sorted(a.params.items()))}) for i, (n, a) in enumerate(sorted(adapters.items()))}
    router = router_for_tags(tok, "<search>", "</search>")
    batch = _trajectories(tok, router, method)
    return Setup(cfg, base, tok, adapters, method, batch, _torch_model(path, cfg, base, dtype), dtype)


def _old_ref(logp: np.ndarray, mask: np.ndarray, seed: int, lc: LossConfig | None = None,
             margin: float = 1e-3) -> tuple[np.ndarray, np.ndarray]:
    """Old / reference log-probs: the current ones plus fixed noise (σ 0.3 / 0.2), so that the ratio
    clip, the dual clip and the KL term all act. A token whose ratio lands within `margin` of a clip
    boundary (1 − ε_low, 1 + ε_high, the dual clip c) is moved off it: the gradient jumps there,
    and the two frameworks' ~1e-6 log-prob differences would decide which side it falls on."""
    lc = lc or LossConfig()
    rng = np.random.default_rng(seed)
    noise = rng.normal(0.0, 0.3, logp.shape)
    bounds = [1.0 - lc.clip_low, 1.0 + lc.clip_high] + ([lc.dual_clip] if lc.dual_clip else [])
    for _ in range(8):
        ratio = np.exp(-noise)
        near = np.zeros(logp.shape, bool)
        for bnd in bounds:
            near |= np.abs(ratio - bnd) < margin * bnd
        if not near.any():
            break
        noise = np.where(near, noise + 10 * margin, noise)
    old = logp + noise * (mask > 0)
    ref = logp + rng.normal(0.0, 0.2, logp.shape) * (mask > 0)
    return old.astype(np.float32), ref.astype(np.float32)


# -- the torch side -----------------------------------------------------------------------------------------
def _torch_forward(setup: Setup, factors, scales, temperature: float):

    from dart_jax.parity import torch_grpo, torch_lora

    def forward_logp(mb: dict):
        handles = torch_lora.install(setup.torch_model, factors, scales, np.asarray(mb["route_ids"]))
        try:
            valid = mb["positions"] >= 0
            logits = setup.torch_model(input_ids=mb["tokens"].long(), attention_mask=valid.long(),
                                       position_ids=mb["positions"].clamp(min=0).long()).logits
        finally:
            for h in handles:
                h.remove()
        return torch_grpo.logprobs_entropy(logits, mb["tokens"], temperature)

    return forward_logp


def _torch_factors(setup: Setup):
    from dart_jax.parity import torch_lora
    names = sorted(setup.adapters)
    return names, [torch_lora.torch_factors(setup.adapters[n]) for n in names], [setup.adapters[n].scale for n in names]


def _torch_batch(batch: dict, old: np.ndarray, ref: np.ndarray, adv: np.ndarray) -> dict:
    import torch
    keys = ("tokens", "positions", "route_ids", "loss_mask")
    out = {k: torch.tensor(batch[k]) for k in keys}
    out.update(old_logp=torch.tensor(old), ref_logp=torch.tensor(ref), advantages=torch.tensor(adv))
    return out


def _our_grads_flat(grads: dict, name: str, target: str, layer: int, r: int):
    ga = np.asarray(grads[name].params[target]["a"][layer], np.float32).reshape(-1, r).T
    gb = np.asarray(grads[name].params[target]["b"][layer], np.float32).reshape(r, -1).T
    return ga, gb


def _stack(batch: dict, keys, micro: int) -> dict:
    n = batch["tokens"].shape[0]
    return {k: jnp.asarray(batch[k]).reshape((n // micro, micro) + batch[k].shape[1:]) for k in keys}


def _runs(lc: LossConfig) -> list[tuple[str, str]]:
    other = "verl_microbatch_mean" if lc.micro_mode == "global" else "global"
    return [(mode, lc.micro_mode) for mode in AGG_MODES] + [("token-mean", other)]


def _jax_values(setup: Setup, lc: LossConfig, old, ref, adv, micro_batch: int) -> dict:
    """Every compared quantity, computed by dart_jax's training code (key -> (tolerance key, array))."""
    b, cfg, base, ads = setup.batch, setup.cfg, setup.base, setup.adapters
    logp, ent = jax.jit(lambda a, t, p, r: sequence_logprobs(base, a, t, p, r, cfg=cfg, temperature=lc.temperature,
                                                             chunk=lc.logprob_chunk))(
        ads, jnp.asarray(b["tokens"]), jnp.asarray(b["positions"]), jnp.asarray(b["route_ids"]))
    logp, ent = np.asarray(logp, np.float32), np.asarray(ent, np.float32)
    m, mask = b["loss_mask"] > 0, jnp.asarray(b["loss_mask"])
    pg, _ = clipped_policy_loss(jnp.asarray(logp), jnp.asarray(old), jnp.asarray(adv)[:, None], lc.clip_low,
                                lc.clip_high, lc.dual_clip)
    kl = kl_penalty(jnp.asarray(logp), jnp.asarray(ref), lc.kl_type, lc.kl_clamp)
    out = {"advantages": ("advantages", adv), "log-probs (loss tokens)": ("logp", logp[m]),
           "entropy (loss tokens)": ("entropy", ent[m]),
           "ratio (loss tokens)": ("ratio", np.exp(np.clip(logp - old, -20, 20))[m])}
    for mode in AGG_MODES:
        for term, v in (("pg_loss", pg), ("kl", kl), ("entropy", jnp.asarray(ent))):
            out[f"{term} [{mode}]"] = ("loss", np.float64(aggregate(v, mask, mode, lc.norm_length)))
    full = dict(b, old_logp=old, ref_logp=ref, advantages=adv)
    names = sorted(ads)
    for mode, micro in _runs(lc):
        lcm = dataclasses.replace(lc, agg_mode=mode, micro_mode=micro)
        grads, sums = jax.jit(make_accumulate(cfg, setup.method, lcm))(ads, base, _stack(full, BATCH_KEYS, micro_batch),
                                                                      jax.random.PRNGKey(0))
        flat = []
        for name in names:
            r = ads[name].rank
            for target in sorted(ads[name].params):
                for layer in range(cfg.num_layers):
                    ga, gb = _our_grads_flat(grads, name, target, layer, r)
                    flat += [ga.ravel(), gb.ravel()]
        label = f"[{mode}, {micro}]"
        out[f"total loss {label}"] = ("loss", np.float64(sums["loss"]))
        out[f"grad (A, B of both adapters) {label}"] = ("grad", np.concatenate(flat))
        out[f"grad, largest component error {label}"] = ("grad_max", np.concatenate(flat))
    return out


def _torch_values(setup: Setup, torch_model, lc: LossConfig, old, ref, micro_batch: int,
                  response_length: int) -> dict:
    """The same quantities from PyTorch (`torch_grpo`), in the same order and layout."""
    import torch

    from dart_jax.parity import torch_grpo, torch_lora
    b, ads = setup.batch, setup.adapters
    names = sorted(ads)
    factors = [torch_lora.torch_factors(ads[n]) for n in names]
    fwd = _torch_forward(dataclasses.replace(setup, torch_model=torch_model), factors,
                         [ads[n].scale for n in names], lc.temperature)
    adv = torch_grpo.grpo_advantages(torch.tensor(b["scores"]), b["uids"])
    tb = _torch_batch(b, old, ref, adv.numpy())
    m, tmask = b["loss_mask"] > 0, torch.tensor(b["loss_mask"])
    with torch.no_grad():
        logp, ent = (x.float() for x in fwd(tb))
        terms = torch_grpo.micro_loss_terms(logp, ent, tb, lc)
    out = {"advantages": ("advantages", adv.numpy()), "log-probs (loss tokens)": ("logp", logp.numpy()[m]),
           "entropy (loss tokens)": ("entropy", ent.numpy()[m]),
           "ratio (loss tokens)": ("ratio", terms["ratio"].numpy()[m])}
    for mode in AGG_MODES:
        for term, key in (("pg_loss", "pg"), ("kl", "kl"), ("entropy", "entropy")):
            out[f"{term} [{mode}]"] = ("loss", np.float64(torch_grpo.aggregate(terms[key], tmask, mode,
                                                                               response_length)))
    for mode, micro in _runs(lc):
        lcm = dataclasses.replace(lc, agg_mode=mode, micro_mode=micro)
        for f in factors:
            for A, B in f.values():
                A.grad, B.grad = None, None
        loss = torch_grpo.minibatch_loss(fwd, tb, lcm, micro_batch, response_length)
        loss.backward()
        flat = []
        for i, name in enumerate(names):
            for target in sorted(ads[name].params):
                for layer in range(setup.cfg.num_layers):
                    A, B = factors[i][(layer, target)]
                    flat += [A.grad.numpy().ravel(), B.grad.numpy().ravel()]
        label = f"[{mode}, {micro}]"
        out[f"total loss {label}"] = ("loss", np.float64(loss.detach()))
        out[f"grad (A, B of both adapters) {label}"] = ("grad", np.concatenate(flat))
        out[f"grad, largest component error {label}"] = ("grad_max", np.concatenate(flat))
    return out


# bf16: each side's distance from the fp32 reference; ours may be at most this many times PyTorch's
BF16_RATIO = 2.0


def crosscheck_loss(model: str, dtype: str = "float32", lc: LossConfig | None = None, micro_batch: int = 2,
                    reference: str = "dart_jax", differences: list | None = None, seed: int = 0,
                    setup: Setup | None = None, response_length: int = RESPONSE_LENGTH) -> CheckReport:
    """fp32: ours vs PyTorch, quantity by quantity. bf16: both frameworks' bf16 results against
    PyTorch in fp32 (the same inputs); ours passes when its error is at most BF16_RATIO × PyTorch's
    own bf16 error (+ the fp32 tolerance), since two bf16 implementations round differently and a
    direct bf16-vs-bf16 difference measures rounding, not correctness."""
    t0 = time.time()
    lc = dataclasses.replace(lc or LossConfig(), norm_length=response_length)
    setup = setup or prepare(model, dtype, seed=seed)
    b = setup.batch
    mask = b["loss_mask"]
    if dtype == "float32":
        ref_torch = setup.torch_model
    else:  # the fp32 reference: PyTorch in fp32 on the same weights
        from dart_jax.models.names import resolve
        ref_torch = _torch_model(resolve(model), setup.cfg, jax.tree.map(lambda x: np.asarray(x, np.float32),
                                                                          setup.base), "float32")
    # old / reference log-probs from the fp32 reference policy, so neither side is favoured
    logp0 = _reference_logp(setup, ref_torch, lc.temperature)
    old, ref = _old_ref(logp0, mask, seed, lc, MARGIN["float32"])
    gid, ng = group_index(b["uids"])
    adv = np.asarray(grpo_advantages(jnp.asarray(b["scores"]), jnp.asarray(gid), ng), np.float32)
    ours = _jax_values(setup, lc, old, ref, adv, micro_batch)
    ref_vals = _torch_values(setup, ref_torch, lc, old, ref, micro_batch, response_length)
    quantities = []
    if dtype == "float32":
        for name, (key, v) in ours.items():
            quantities.append(quantity(name, key, v, ref_vals[name][1], dtype))
    else:
        theirs = _torch_values(setup, setup.torch_model, lc, old, ref, micro_batch, response_length)
        for name, (key, v) in ours.items():
            kind, t32, _ = TOLERANCES[key]
            d_ours, scale = metric(kind, v, ref_vals[name][1])
            d_theirs, _ = metric(kind, theirs[name][1], ref_vals[name][1])
            if kind in ("rel", "norm"):
                d_ours, d_theirs = d_ours / max(scale, 1e-30), d_theirs / max(scale, 1e-30)
            allowed = BF16_RATIO * d_theirs + (t32 or 0.0)
            q = Quantity(f"{name}: ours bf16 vs fp32 (PyTorch bf16 vs fp32: {d_theirs:.2e})", "abs", d_ours,
                         scale, t32, allowed, bool(np.isfinite(d_ours) and d_ours <= allowed))
            quantities.append(q)
    m = mask > 0
    ratio = np.exp(np.clip(logp0 - old, -20, 20))
    settings = {"temperature": lc.temperature, "kl_type": lc.kl_type, "kl_coef": lc.kl_coef, "kl_clamp": lc.kl_clamp,
                "entropy_coef": lc.entropy_coef, "clip": [lc.clip_low, lc.clip_high], "dual_clip": lc.dual_clip,
                "micro_mode": lc.micro_mode, "micro_batch": micro_batch, "trajectories": int(len(adv)),
                "sum_norm_length": response_length, "padded_width": int(mask.shape[1]),
                "loss_tokens": int(mask.sum()), "tool_tokens": int(((b["loss_roles"] == 1) & m).sum()),
                "clipped_share": float(np.mean((np.abs(ratio - 1) > lc.clip_high)[m])),
                "bf16_rule": (f"ours bf16 within {BF16_RATIO}× PyTorch's bf16 distance from PyTorch fp32 "
                              "(+ the fp32 tolerance)") if dtype != "float32" else None}
    return CheckReport("loss", model, dtype, reference, settings, list(differences or []), quantities,
                       round(time.time() - t0, 1))


def _reference_logp(setup: Setup, torch_model, temperature: float) -> np.ndarray:
    """Token log-probs of the policy (adapters on) from a PyTorch model: the base of old / ref."""
    import torch

    from dart_jax.parity import torch_lora
    names = sorted(setup.adapters)
    factors = [torch_lora.torch_factors(setup.adapters[n]) for n in names]
    fwd = _torch_forward(dataclasses.replace(setup, torch_model=torch_model), factors,
                         [setup.adapters[n].scale for n in names], temperature)
    b = setup.batch
    with torch.no_grad():
        logp, _ = fwd({k: torch.tensor(b[k]) for k in ("tokens", "positions", "route_ids")})
    return logp.float().numpy()
