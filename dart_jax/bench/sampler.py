"""Sampler benchmarks: decode throughput vs transformers `generate`, achieved FLOP/s vs a plain
matmul on the same machine, and KV-cache resume vs re-prefilling the history every turn. Sides are
interleaved round by round, ratios reported as median and range (timing.py)."""

from __future__ import annotations

import time

import jax
import jax.numpy as jnp
import numpy as np

from dart_jax.bench.timing import interleaved, matmul_probe, peak_per_round, ratio
from dart_jax.checkpoints.registry import load_model
from dart_jax.models.cache import init_cache
from dart_jax.models.generate import left_pad
from dart_jax.models.names import resolve
from dart_jax.models.transformer import per_layer_params
from dart_jax.roles.router import RouterSpec
from dart_jax.rollout.sampler import (
    SamplerSpec,
    append,
    bucket,
    cache_used,
    decode_segment,
    ensure_capacity,
    lower_prefill,
    prefill,
)
from dart_jax.rollout.sampling import SamplingConfig


def _spec(cfg, temperature: float = 0.0) -> SamplerSpec:
    never = cfg.vocab_size + 7  # an id no row can sample: decode runs the full budget
    return SamplerSpec(cfg, RouterSpec((never + 1,), (never + 2,)), SamplingConfig(temperature=temperature),
                       ((never,),), "none")


def decode_flops_per_token(cfg, context: int) -> float:
    """2 · (non-embedding params + output head) + attention over `context` keys, per token."""
    d, v = cfg.hidden_size, cfg.vocab_size
    dense = cfg.num_params() - v * d * (1 if cfg.tie_word_embeddings else 2)
    attn = 2 * 2 * cfg.num_layers * cfg.num_heads * cfg.head_dim * context
    return 2 * (dense + d * v) + attn


def _ours_generate(base, cfg, prompt: np.ndarray, new: int, temperature: float = 0.0):
    """run() -> tokens: prefill `prompt` and decode exactly `new` tokens a row. run.compiled_texts() -> the
    compiled text of the prefill's and the decode's programs for the same arguments (bench.profile_decode)."""
    spec = _spec(cfg, temperature)
    b, t = prompt.shape
    pos = jnp.broadcast_to(jnp.arange(t, dtype=jnp.int32), (b, t))
    args = lambda: (jnp.ones((b,), bool), jnp.ones((b, 1), bool), jnp.full((b,), new, jnp.int32))  # noqa: E731

    def run():
        cache = init_cache(cfg, b, t + new + 1)
        state, _ = prefill(base, None, jnp.asarray(prompt), pos, cache, jax.random.PRNGKey(0), spec=spec)
        state, seg = decode_segment(base, None, state, *args(), spec=spec, length=new)
        return jax.block_until_ready(seg.tokens)

    def compiled_texts() -> list[str]:
        cache = init_cache(cfg, b, t + new + 1)
        pre = lower_prefill(base, None, jnp.asarray(prompt), pos, cache, jax.random.PRNGKey(0), spec=spec)
        state, _ = prefill(base, None, jnp.asarray(prompt), pos, cache, jax.random.PRNGKey(0), spec=spec)
        dec = decode_segment.lower(base, None, state, *args(), spec=spec, length=new)
        return [pre.compile().as_text(), dec.compile().as_text()]
    run.compiled_texts = compiled_texts
    return run


def torch_generate(ref, prompt: np.ndarray, new: int, temperature: float = 0.0):
    """generate() with transformers: the same prompts, exactly `new` tokens a row, greedy or plain sampling."""
    import torch
    sampling = dict(do_sample=True, temperature=temperature, top_k=0, top_p=1.0) if temperature else \
        dict(do_sample=False)
    tt = torch.tensor(prompt, dtype=torch.long)

    def generate():
        with torch.no_grad():
            ref.generate(tt, attention_mask=torch.ones_like(tt), max_new_tokens=new, min_new_tokens=new,
                         pad_token_id=0, **sampling)
    return generate


def bench_sampler(model: str = "smollm2-135m-instruct", batches=(1, 8, 32), new_tokens: int = 128,
                  prompt_len: int = 32, repeats: int = 5, with_torch: bool = True, dtype: str = "float32",
                  temperature: float = 0.0) -> dict:
    """Decode throughput, ours vs transformers `generate`, same dtype and sampling on both sides
    (greedy, or plain sampling at `temperature`); every row decodes exactly `new_tokens`."""
    path = resolve(model)
    cfg, base = load_model(path, param_dtype=dtype, compute_dtype=dtype)
    base = per_layer_params(base)  # the sampler's layout, made once per base (as in rollouts)
    mm, mm_flops = matmul_probe()
    rng = np.random.default_rng(0)
    rows = []
    ref = None
    if with_torch:
        import torch

        from dart_jax.parity.model_check import load_torch_model
        ref = load_torch_model(path).to(getattr(torch, dtype))
    peaks = []
    for b in batches:
        prompt = rng.integers(100, cfg.vocab_size, (b, prompt_len)).astype(np.int32)
        sides = {"dart_jax": _ours_generate(base, cfg, prompt, new_tokens, temperature), "matmul": mm}
        if ref is not None:
            sides["transformers"] = torch_generate(ref, prompt, new_tokens, temperature)
        res = interleaved(sides, repeats=repeats)
        peak = peak_per_round(res, mm_flops)
        peaks += peak
        ours = res["dart_jax"]
        row = {"batch": b, "ours_s": ours["median_s"], "ours_tok_s": b * new_tokens / ours["median_s"]}
        flops = b * new_tokens * decode_flops_per_token(cfg, prompt_len + new_tokens // 2)
        row["ours_flops_frac_of_matmul"] = float(np.median([flops / t / p for t, p in zip(ours["times_s"], peak)]))
        if ref is not None:
            row.update(hf_s=res["transformers"]["median_s"], hf_tok_s=b * new_tokens / res["transformers"]["median_s"],
                       ratio=ratio(res, "transformers", "dart_jax"))
        rows.append(row)
    peak = float(np.median(peaks))
    return {"bench": "sampler", "model": model, "new_tokens": new_tokens, "prompt_len": prompt_len,
            "dtype": dtype, "temperature": temperature, "matmul_flops": peak, "rows": rows}


def bench_cache_blocks(model: str = "smollm2-135m-instruct", batch: int = 32, filled: int = 768,
                       capacity: int = 1536, new_tokens: int = 64, repeats: int = 4, block: int = 128,
                       dtype: str = "float32") -> dict:
    """Decode attention over the cache's written blocks (`cache_block`) vs over its whole capacity:
    a batch whose cache holds `filled` slots of `capacity` (a decode segment's worst case is a cache
    grown for the longest turn and a turn that stops early) decodes `new_tokens` tokens, greedy, on
    both sides from copies of one prefilled state; interleaved with a matmul probe."""
    path = resolve(model)
    cfg, base = load_model(path, param_dtype=dtype, compute_dtype=dtype)
    base = per_layer_params(base)
    rng = np.random.default_rng(0)
    prompt = jnp.asarray(rng.integers(100, cfg.vocab_size, (batch, filled)), jnp.int32)
    pos = jnp.broadcast_to(jnp.arange(filled, dtype=jnp.int32), (batch, filled))
    state0, _ = prefill(base, None, prompt, pos, init_cache(cfg, batch, capacity), jax.random.PRNGKey(0),
                        spec=_spec(cfg))
    ones, stop_on, budget = jnp.ones((batch,), bool), jnp.ones((batch, 1), bool), jnp.full((batch,), new_tokens,
                                                                                          jnp.int32)

    def side(c):
        spec = _spec(c)

        def run():
            state = jax.tree.map(jnp.copy, state0)  # decode_segment donates its state
            _, seg = decode_segment(base, None, state, ones, stop_on, budget, spec=spec, length=new_tokens)
            return jax.block_until_ready(seg.tokens)
        return run
    blocked, whole = side(cfg.replace(cache_block=block)), side(cfg.replace(cache_block=0))
    same = bool(np.array_equal(np.asarray(blocked()), np.asarray(whole())))
    mm, mm_flops = matmul_probe()
    res = interleaved({"blocks": blocked, "whole": whole, "matmul": mm}, repeats=repeats)
    return {"bench": "cache_blocks", "model": model, "batch": batch, "filled": filled, "capacity": capacity,
            "new_tokens": new_tokens, "block": block, "dtype": dtype, "same_tokens": same,
            "blocks_s": res["blocks"]["median_s"], "whole_s": res["whole"]["median_s"],
            "ratio": ratio(res, "whole", "blocks"), "matmul_flops": float(np.median(peak_per_round(res, mm_flops)))}


def resume_sides(cfg, base, batch: int, prompt_len: int, turns: int, gen_per_turn: int, obs_len: int,
                 seed: int = 0):
    """(resume, reprefill): closures running one rollout with `turns` tool calls over random ids on
    `base` (the per-layer decode layout) — our KV-cache resume and the re-prefill way."""
    spec = _spec(cfg)
    rng = np.random.default_rng(seed)
    prompt = jnp.asarray(rng.integers(100, cfg.vocab_size, (batch, prompt_len)), jnp.int32)
    obs = [jnp.asarray(rng.integers(100, cfg.vocab_size, (batch, obs_len)), jnp.int32) for _ in range(turns)]
    ones, stop_on = jnp.ones((batch,), bool), jnp.ones((batch, 1), bool)
    budget = jnp.full((batch,), gen_per_turn, jnp.int32)

    def resume():
        cache = init_cache(cfg, batch, bucket(prompt_len + gen_per_turn))
        pos = jnp.broadcast_to(jnp.arange(prompt_len, dtype=jnp.int32), (batch, prompt_len))
        state, _ = prefill(base, None, prompt, pos, cache, jax.random.PRNGKey(0), spec=spec)
        for k in range(turns + 1):
            state = ensure_capacity(state, cache_used(state) + gen_per_turn)
            state, seg = decode_segment(base, None, state, ones, stop_on, budget, spec=spec, length=gen_per_turn)
            if k < turns:
                state = ensure_capacity(state, cache_used(state) + obs_len + 1 + gen_per_turn)
                state, _ = append(base, None, state, obs[k], jnp.full((batch,), obs_len, jnp.int32), ones, spec=spec)
        return jax.block_until_ready(seg.tokens)

    def reprefill():
        history = prompt
        for k in range(turns + 1):
            t = history.shape[1]
            cache = init_cache(cfg, batch, t + gen_per_turn + 1)
            pos = jnp.broadcast_to(jnp.arange(t, dtype=jnp.int32), (batch, t))
            state, _ = prefill(base, None, history, pos, cache, jax.random.PRNGKey(0), spec=spec)
            state, seg = decode_segment(base, None, state, ones, stop_on, budget, spec=spec, length=gen_per_turn)
            if k < turns:
                history = jnp.concatenate([history, seg.tokens, obs[k]], axis=1)
        return jax.block_until_ready(seg.tokens)

    return resume, reprefill


def bench_resume(model: str = "smollm2-135m-instruct", batch: int = 8, prompt_len: int = 256, turns: int = 4,
                 gen_per_turn: int = 64, obs_len: int = 128, repeats: int = 4) -> dict:
    """A rollout with `turns` tool calls: ours appends each observation to the cache; the
    re-prefill way (Search-R1 / SkyRL) prefills the whole history again before every turn."""
    cfg, base = load_model(resolve(model))
    base = per_layer_params(base)
    resume, reprefill = resume_sides(cfg, base, batch, prompt_len, turns, gen_per_turn, obs_len, seed=0)
    t0 = time.perf_counter()
    res = interleaved({"resume": resume, "reprefill": reprefill}, repeats=repeats)
    return {"bench": "resume", "model": model, "batch": batch, "turns": turns, "prompt_len": prompt_len,
            "gen_per_turn": gen_per_turn, "obs_len": obs_len, "resume_s": res["resume"]["median_s"],
            "reprefill_s": res["reprefill"]["median_s"], "ratio": ratio(res, "reprefill", "resume"),
            "wall_s": time.perf_counter() - t0}


def bench_group_prefill(model: str = "smollm2-135m-instruct", prompts: int = 2, group: int = 4,
                        gen: int = 32, repeats: int = 3) -> dict:
    """Prefill + one decode segment for `prompts` SkyRL-SQL schema prompts (real Spider databases)
    × `group` samples: one prefill per distinct prompt with the cache broadcast to the group's rows
    vs one prefill per row (every row its own copy of the prompt)."""
    from dart_jax.rollout.tasks import spider_rows, sql_task
    from dart_jax.tokenization.tokenizer import load_tokenizer

    cfg, base = load_model(resolve(model))
    base = per_layer_params(base)
    spec = _spec(cfg)
    tok = load_tokenizer(resolve(model))
    ids, _, _ = sql_task(tok, spider_rows(n=prompts))
    t = bucket(max(len(p) for p in ids))
    b = prompts * group

    def pad(rows):  # left-padded to the prompt bucket, as the agent does
        tokens, positions = left_pad(rows)
        extra = t - tokens.shape[1]
        return (jnp.pad(tokens, ((0, 0), (extra, 0))), jnp.pad(positions, ((0, 0), (extra, 0)), constant_values=-1))

    uniq, upos = pad(ids)
    full, fpos = pad([p for p in ids for _ in range(group)])
    rows = jnp.asarray(np.repeat(np.arange(prompts), group), jnp.int32)
    ones, stop_on, budget = jnp.ones((b,), bool), jnp.ones((b, 1), bool), jnp.full((b,), gen, jnp.int32)

    def run(tokens, positions, r):
        cache = init_cache(cfg, tokens.shape[0], bucket(t + gen))
        state, _ = prefill(base, None, tokens, positions, cache, jax.random.PRNGKey(0), r, spec=spec)
        state, seg = decode_segment(base, None, state, ones, stop_on, budget, spec=spec, length=gen)
        return jax.block_until_ready(seg.tokens)

    t0 = time.perf_counter()
    res = interleaved({"shared": lambda: run(uniq, upos, rows), "per_row": lambda: run(full, fpos, None)},
                      repeats=repeats)
    return {"bench": "prefill", "model": model, "prompts": prompts, "group": group, "prompt_tokens": t,
            "gen": gen, "shared_s": res["shared"]["median_s"], "per_row_s": res["per_row"]["median_s"],
            "ratio": ratio(res, "per_row", "shared"), "wall_s": time.perf_counter() - t0}


def bench_handoff(model: str = "smollm2-135m-instruct", batch: int = 1, prompt_len: int = 256, turns: int = 4,
                  reason_len: int = 48, span_len: int = 16, obs_len: int = 128, repeats: int = 3) -> dict:
    """A two-model rollout (CEA's H_Tool / H_Reas, the 2-Agent baseline) with `turns` tool calls: the
    reasoning model writes `reason_len` tokens, the tool model a `span_len`-token call, an
    `obs_len`-token observation follows, control returns; then a final answer segment.

    append-only (rollout.compose): each hand-off appends to the incoming model's own cache only the
    tokens it has not seen. re-encode (the authors' hybrid and the paper's 2-Agent): each hand-off
    prefills the incoming model over the whole history. Time to the incoming model's first token
    per hand-off (TTFT) and the whole rollout; the two models are SmolLM2 and a perturbed copy."""
    cfg, base_r = load_model(resolve(model))
    base_r = per_layer_params(base_r)
    base_t = jax.tree_util.tree_map(lambda x: x * 1.01 if x.ndim >= 2 else x, base_r)
    spec = _spec(cfg)
    bases = (base_r, base_t)
    rng = np.random.default_rng(0)
    prompt = jnp.asarray(rng.integers(100, cfg.vocab_size, (batch, prompt_len)), jnp.int32)
    obs = [jnp.asarray(rng.integers(100, cfg.vocab_size, (batch, obs_len)), jnp.int32) for _ in range(turns)]
    ones, stop_on = jnp.ones((batch,), bool), jnp.ones((batch, 1), bool)
    lens = [reason_len, span_len]
    plan = [0, 1] * turns + [0]  # writer of each segment: reasoning, tool, ..., final reasoning
    pos0 = jnp.broadcast_to(jnp.arange(prompt_len, dtype=jnp.int32), (batch, prompt_len))
    ttft: dict[str, list[float]] = {"append": [], "reencode": []}

    def append_only():
        states = []
        for w in (0, 1):
            cache = init_cache(cfg, batch, bucket(prompt_len + 64))
            st, _ = prefill(bases[w], None, prompt, pos0, cache, jax.random.PRNGKey(0), spec=spec, hold_last=True)
            states.append(st)
        unseen = [[], []]  # per model: chunks of the trajectory its cache has not seen
        times = []
        for k, w in enumerate(plan):
            t0 = time.perf_counter()
            delta = jnp.concatenate(unseen[w], axis=1) if unseen[w] else jnp.zeros((batch, 0), jnp.int32)
            width = bucket(max(1, delta.shape[1]))
            chunk = jnp.pad(delta, ((0, 0), (0, width - delta.shape[1])))
            st = ensure_capacity(states[w], cache_used(states[w]) + width + 1 + 64)
            st, _ = append(bases[w], None, st, chunk, jnp.full((batch,), delta.shape[1], jnp.int32), ones, spec=spec)
            jax.block_until_ready(st.pending)
            times.append(time.perf_counter() - t0)
            unseen[w] = []
            st = ensure_capacity(st, cache_used(st) + lens[w])
            st, seg = decode_segment(bases[w], None, st, ones, stop_on, jnp.full((batch,), lens[w], jnp.int32),
                                     spec=spec, length=bucket(lens[w]))
            jax.block_until_ready(seg.tokens)  # the next hand-off's clock must not absorb this decode
            states[w] = st
            new = [seg.tokens[:, :lens[w]]] + ([obs[k // 2]] if w == 1 else [])
            unseen[1 - w] += new
            if w == 1:
                unseen[1] += [obs[k // 2]]
        ttft["append"] = times
        return jax.block_until_ready(seg.tokens)

    def reencode():
        history = prompt
        times = []
        for k, w in enumerate(plan):
            t0 = time.perf_counter()
            t = history.shape[1]
            cache = init_cache(cfg, batch, t + bucket(lens[w]) + 1)
            pos = jnp.broadcast_to(jnp.arange(t, dtype=jnp.int32), (batch, t))
            st, _ = prefill(bases[w], None, history, pos, cache, jax.random.PRNGKey(0), spec=spec)
            jax.block_until_ready(st.pending)
            times.append(time.perf_counter() - t0)
            st, seg = decode_segment(bases[w], None, st, ones, stop_on, jnp.full((batch,), lens[w], jnp.int32),
                                     spec=spec, length=bucket(lens[w]))
            jax.block_until_ready(seg.tokens)
            history = jnp.concatenate([history, seg.tokens[:, :lens[w]]] + ([obs[k // 2]] if w == 1 else []), axis=1)
        ttft["reencode"] = times
        return jax.block_until_ready(seg.tokens)

    t0 = time.perf_counter()
    res = interleaved({"append": append_only, "reencode": reencode}, repeats=repeats)
    return {"bench": "handoff", "model": model, "batch": batch, "turns": turns, "prompt_len": prompt_len,
            "reason_len": reason_len, "span_len": span_len, "obs_len": obs_len,
            "append_s": res["append"]["median_s"], "reencode_s": res["reencode"]["median_s"],
            "ratio": ratio(res, "reencode", "append"),
            "ttft_append_s": ttft["append"], "ttft_reencode_s": ttft["reencode"],
            "ttft_ratio_last": ttft["reencode"][-1] / ttft["append"][-1], "wall_s": time.perf_counter() - t0}
