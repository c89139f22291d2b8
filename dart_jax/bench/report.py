"""What `launch.bench` prints: each benchmark's result (the dict its bench_* / run_suite function returns,
the one --json writes) as text — a line or two for the side-by-side benchmarks, markdown tables for
`methods` and `suite`. Formatting only: nothing here runs or times anything.

    text("train", bench_train(...))   # the benchmark's name (launch.bench's BENCHES) and its result
"""

from __future__ import annotations

from dart_jax.analysis.tables import markdown_table
from dart_jax.bench.timing import fmt_ratio


def forward(res: dict) -> str:
    return (f"forward {res['model']} {res['batch']}x{res['length']} {res['dtype']} on {res['device']}: "
            f"dart_jax {res['ours_tokens_per_s']:.0f} tok/s ({100 * res['ours_flops_frac_of_matmul']:.0f}% of "
            f"matmul {res['matmul_flops'] / 1e9:.0f} GFLOP/s), transformers {res['transformers_tokens_per_s']:.0f} "
            f"tok/s; transformers / dart_jax time {fmt_ratio(res['ratio'])}")


def adapters(res: dict) -> str:
    ms = res["median_s"]
    return (f"fwd+bwd {res['model']} {res['batch']}x{res['length']} on {res['device']} (median s): "
            + ", ".join(f"{k} {v:.3f}" for k, v in ms.items()) + "\n"
            + f"DART / LoRA {fmt_ratio(res['dart_over_lora'])}\nfull / LoRA {fmt_ratio(res['full_over_lora'])}"
            + (f"\ntorch PEFT LoRA / ours LoRA {fmt_ratio(res['torch_peft_over_ours_lora'])}"
               if "torch_peft_over_ours_lora" in res else ""))


def sampler(res: dict) -> str:
    lines = [f"matmul peak {res['matmul_flops'] / 1e9:.1f} GFLOP/s; {res['new_tokens']} new tokens, {res['dtype']}, "
             f"{'greedy' if not res['temperature'] else 'T = %g' % res['temperature']}"]
    for r in res["rows"]:
        line = (f"batch {r['batch']:>3}: dart_jax {r['ours_tok_s']:8.1f} tok/s "
                f"({100 * r['ours_flops_frac_of_matmul']:.1f}% of matmul FLOP/s)")
        if "hf_tok_s" in r:
            line += f", transformers generate {r['hf_tok_s']:8.1f} tok/s, time ratio {fmt_ratio(r['ratio'])}"
        lines.append(line)
    return "\n".join(lines)


def matmul(res: dict) -> str:
    lines = [f"matmul peak {res['matmul_flops'] / 1e9:.1f} GFLOP/s (2048² fp32); GFLOP/s per side, then time ratios"]
    for r in res["rows"]:
        g = ", ".join(f"{k} {v:.0f}" for k, v in r["gflops"].items())
        line = (f"{r['name']:>4} [{r['m']}, {r['k']}] × [{r['k']}, {r['n']}]: {g}; bf16-out / fp32-accumulated "
                f"{fmt_ratio(r['bf16_out_over_acc32'])}")
        if "torch_bf16_over_jax_bf16_acc32" in r:
            line += f"; torch bf16 / ours bf16 {fmt_ratio(r['torch_bf16_over_jax_bf16_acc32'])}"
        a = r["agree"]
        lines.append(line + f"; values differing {a['differing']} of {a['of']} (at most "
                     f"{a['max_diff_of_scale']:.1e} of the largest)")
    return "\n".join(lines)


def resume(res: dict) -> str:
    return (f"{res['turns']} tool calls, batch {res['batch']}, prompt {res['prompt_len']}, "
            f"{res['gen_per_turn']} generated + {res['obs_len']} observation tokens per turn: cache resume "
            f"{res['resume_s']:.2f} s, re-prefill {res['reprefill_s']:.2f} s, re-prefill / resume "
            f"{fmt_ratio(res['ratio'])}")


def cache_blocks(res: dict) -> str:
    return (f"decode {res['new_tokens']} tokens, batch {res['batch']}, cache {res['filled']} of {res['capacity']} "
            f"slots ({res['dtype']}): written blocks of {res['block']} {res['blocks_s']:.2f} s, whole capacity "
            f"{res['whole_s']:.2f} s, whole / blocks {fmt_ratio(res['ratio'])}; same tokens: {res['same_tokens']}")


TORCH_SIDES = {"concat_2r": "the authors' concatenated-2r module (same update)",
               "peft_r16": "PEFT, one rank-16 adapter (floor: no routing)",
               "hooks": "hook reference, both adapters on every token (≈2× LoRA work)"}


def train(res: dict) -> str:
    ms = res["median_s"]
    lines = [f"GRPO update (DART 2x r8) {res['model']} {res['batch']}x{res['length']} on {res['device']}: "
             f"dart_jax {ms['dart_jax']:.2f} s ({100 * res['ours_flops_frac_of_matmul']:.1f}% of matmul "
             f"{res['matmul_flops'] / 1e9:.1f} GFLOP/s measured in the same rounds)"]
    for side, r in res["ratios"].items():
        lines.append(f"  torch {TORCH_SIDES[side]}: {ms['torch_' + side]:.2f} s; torch / dart_jax {fmt_ratio(r)}")
    return "\n".join(lines)


def prefill(res: dict) -> str:
    return (f"{res['prompts']} SQL schema prompts ({res['prompt_tokens']} tokens) x {res['group']} samples, prefill + "
            f"{res['gen']} decoded tokens: shared prefill {res['shared_s']:.2f} s, one per row "
            f"{res['per_row_s']:.2f} s; per row / shared {fmt_ratio(res['ratio'])}")


def group_update(res: dict) -> str:
    ms, fr = res["median_s"], res["flops_frac_of_matmul"]
    line = (f"GRPO update of one group, {res['group']} rows x ({res['prompt']} prompt + {res['cont']} own tokens), "
            f"{res['model']} on {res['device']}, remat {res['remat_policy']}: prompt once {ms['shared']:.2f} s "
            f"({100 * fr['shared']:.0f}% of matmul), once per row {ms['per_row']:.2f} s ({100 * fr['per_row']:.0f}%); "
            f"per row / once {fmt_ratio(res['per_row_over_shared'])}; last losses "
            + ", ".join(f"{k} {v:.6f}" for k, v in res["last_loss"].items()))
    if "torch_over_shared" in res:
        line += (f"\n  torch (concatenated 2r, full rows) {ms['torch_concat_2r']:.2f} s; torch / prompt once "
                 f"{fmt_ratio(res['torch_over_shared'])}")
    return line


def methods(res: dict) -> str:
    """bench.methods: the training state and update time per method, one table."""
    rows = []
    for name, r in res["rows"].items():
        rel = r.get("step_over_dart")
        rows.append([name, f"{r['trainable_params'] / 1e6:.2f} M ({100 * r['trainable_share']:.2f}%)",
                     f"{r['total_bytes'] / 2 ** 20:.0f} MiB", f"{r['total_in_P']:.2f} P",
                     f"{r.get('step_s', float('nan')):.2f}",
                     "%.2f× (%.2f–%.2f)" % (rel["median"], rel["min"], rel["max"]) if rel else "—"])
    head = (f"{res['model']} in {res['dtype']} ({res['params'] / 1e6:.1f} M parameters, P = "
            f"{res['P_bytes'] / 2 ** 20:.0f} MiB) on {res['device']}, batch {res['batch']} × {res['length']}:")
    return "\n".join([head, markdown_table(["method", "trainable", "base + train state", "in P", "step (s)",
                                            "step / DART"], rows)])


def handoff(res: dict) -> str:
    return (f"two-model rollout, batch {res['batch']}, prompt {res['prompt_len']}, {res['turns']} tool calls "
            f"({res['reason_len']} reasoning + {res['span_len']} tool tokens, {res['obs_len']}-token observations): "
            f"append-only {res['append_s']:.2f} s, re-encode {res['reencode_s']:.2f} s, re-encode / append "
            f"{fmt_ratio(res['ratio'])}\n"
            "time to the incoming model's first token per hand-off (ms): append-only "
            + " ".join(f"{1e3 * t:.0f}" for t in res["ttft_append_s"]) + "; re-encode "
            + " ".join(f"{1e3 * t:.0f}" for t in res["ttft_reencode_s"]))


def suite(res: dict) -> str:
    """bench.suite: every section; a failed section prints its error."""
    def part(name, fn):
        sec = res.get(name, {})
        if "error" in sec:
            return [f"{name}: failed: {sec['error']}"]
        return fn(sec)

    def peaks(p):
        nominal = f", nominal {p['nominal_bf16_flops'] / 1e12:.0f} TFLOP/s" if p["nominal_bf16_flops"] else ""
        return [f"measured matmul {p['matmul_flops'] / 1e12:.2f} TFLOP/s (bf16 {p['matmul_n']}²{nominal}), copy "
                f"{p['bandwidth_bytes_s'] / 1e9:.1f} GB/s"]

    def train(t):
        rows = []
        for name, r in t["methods"].items():
            if "error" in r:
                rows.append([name, f"failed: {r['error']}", "", "", "", "", ""])
                continue
            mfu_n = f"{100 * r['mfu_nominal']:.1f}%" if r["mfu_nominal"] is not None else "—"
            rows.append([name, f"{r['step_s']:.3f}", f"{r['tokens_per_s']:.0f}", f"{r['flops_per_s'] / 1e12:.3f}",
                         f"{100 * r['mfu_measured']:.1f}%", mfu_n, f"{r['compile_s']:.1f}"])
        return [f"train, {t['batch']} × {t['length']} tokens, remat {t['remat_policy']}:",
                markdown_table(["method", "step (s)", "tokens/s", "TFLOP/s", "MFU (measured peak)", "MFU (nominal)",
                                "compile (s)"], rows)]

    def decode(d):
        return [f"decode {d['batch']} × {d['new_tokens']} tokens after {d['prompt']}: {d['tokens_per_s']:.0f} tok/s, "
                f"{d['bandwidth_bytes_s'] / 1e9:.1f} GB/s = {100 * d['bandwidth_share']:.0f}% of the measured copy "
                f"bandwidth; attention over written blocks of {d['cache_block']} vs the whole {d['capacity']}-slot "
                f"cache: whole / blocks = {d['whole_over_blocks']:.2f}×"]

    def attention(a):
        other = (f"{a['cudnn_s']:.3f} s (xla / cudnn = {a['cudnn_over_xla']:.2f}×)" if a["cudnn_s"] else
                 f"unavailable ({a['cudnn_error']})")
        return [f"attention (DART update): xla {a['xla_s']:.3f} s, cudnn {other}"]

    def resume(r):
        return [f"resume vs re-prefill ({r['turns']} calls, {r['obs_len']}-token observations, batch {r['batch']}): "
                f"{r['resume_s']:.3f} s vs {r['reprefill_s']:.3f} s = {r['speedup']:.2f}×"]

    def rollout_memory(r):
        lines = [f"rollout memory, decode {r['batch']} × {r['new_tokens']} after {r['prompt']} (one device):"]
        for name, x in r["layouts"].items():
            lines.append(f"  {name}: failed: {x['error']}" if "error" in x else
                         f"  {name}: peak {x['peak_gib']:.2f} GiB = {x['ratio']:.2f} × (weights "
                         f"{x['weights_gib']:.2f} + KV {x['kv_gib']:.2f}), {x['tokens_per_s']:.0f} tok/s")
        return lines

    lines = [f"{res['model']}, {res.get('params', 0) / 1e6:.0f} M params, on {res['device_kind']} ({res['backend']}, "
             f"jax {res['jax']})"]
    for name, fn in (("peaks", peaks), ("train", train), ("decode", decode), ("attention", attention),
                     ("resume", resume), ("rollout_memory", rollout_memory)):
        lines += part(name, fn)
    lines.append(f"wall {res['wall_s']:.0f} s")
    return "\n".join(lines)


def retrieval(res: dict) -> str:
    return (f"retrieval {res['url']}: {res['clients']} clients x {res['requests_per_client']} requests, "
            f"{res['errors']} errors {res['errors_by_kind'] or ''}; latency p50 {res['p50_ms']:.0f} ms, "
            f"p95 {res['p95_ms']:.0f} ms, max {res['max_ms']:.0f} ms; {res['requests_per_s']:.0f} requests/s"
            + (f"; hostile clients: {res['hostile']}" if res["hostile"] else ""))


def corpus(res: dict) -> str:
    return (f"{res['passages']:,} passages ({res['corpus_mib']:.0f} MiB), offset scan {res['scan_s']:.2f} s; per "
            f"million passages: by byte offset {res['by_offset_rss_mib_per_million']:.1f} MiB resident (anonymous "
            f"{res['by_offset_anon_mib_per_million']:.1f}; offset table {res['offsets_mib_per_million']:.1f} MiB), "
            f"{res['lookup_us']:.0f} us a passage; held as objects {res['as_objects_rss_mib_per_million']:.0f} MiB "
            f"({res['as_objects_load_s']:.1f} s to load)")


def serve(res: dict) -> str:
    a = res["alone"]
    lines = [f"serve: {res['policy']}; tool {res['tool']}",
             f"  alone (1 slot, one at a time): {a['requests_per_s']:.3f} requests/s, "
             f"{a['generated_tokens_per_s']:.0f} generated tokens/s, "
             f"latency p50 {a['p50_latency_s']:.2f} s, p95 {a['p95_latency_s']:.2f} s"]
    for c, s in res["serve"].items():
        b = res["batch"][c]
        lines.append(f"  {c:>3} clients on {s.get('slots', c)} slots: {s['requests_per_s']:.3f} requests/s "
                     f"({s['throughput_over_alone']:.2f}x alone, "
                     f"{s['throughput_over_batch']:.2f}x fixed batches of {c}: {b['requests_per_s']:.3f}), "
                     f"{s['generated_tokens_per_s']:.0f} tokens/s, "
                     f"TTFT p50 {s['p50_ttft_s']:.2f} / p95 {s['p95_ttft_s']:.2f} s, "
                     f"latency p50 {s['p50_latency_s']:.2f} / p95 {s['p95_latency_s']:.2f} s "
                     f"({s['p95_latency_over_lone']:.2f}x a lone request's; a lone request on these slots "
                     f"{s.get('lone_latency_s', float('nan')):.2f} s), {s['errors']} errors, "
                     f"tokens as alone {s['same_tokens_as_alone']}, RSS {s.get('rss_gib', float('nan')):.1f} GiB, "
                     f"engine seconds {s.get('engine_s', {})}, rows per segment {s.get('rows_per_segment')}")
    o = res["overload"]
    lines.append(f"  overload: burst of {o['burst']} on {o['slots']} slots + queue {o['max_waiting']}: "
                 f"{o['codes']}, {o['hung']} hung")
    return "\n".join(lines)


def _engine_vs_batch(res: dict, head: str, unit: str) -> str:
    """A rollouts benchmark's lines: `head`, then each side per `unit` (round / step), the speed-up, and
    the speed-up without compile time."""
    sp, c = res["speedup"], res["tool_calls_per_trajectory"]
    rounds = ", ".join(f"{k} {v} s" for k, v in res["compile_round_s"].items())
    lines = [f"{head}, tool calls per trajectory {c['min']}-{c['max']} (median {c['median']}); compile round: "
             f"{rounds}"]
    for side in [k for k in ("batch", "gathered", "continuous") if k in res]:
        r = res[side]
        lines.append(f"  {side:>10}: {r['wall_s']} s per {unit}, {r['trajectories_per_s']:.3f} trajectories/s, "
                     f"{r['generated_tokens_per_s']:.0f} generated tokens/s")
    lines.append(f"  continuous / batch: {sp['median']:.2f}x (range {sp['min']:.2f}-{sp['max']:.2f} over "
                 f"{res['rounds']} interleaved {unit}s); identical trajectories {res['identical_trajectories']}")
    if "gathered_speedup" in res:
        g = res["gathered_speedup"]
        lines.append(f"  gathered / batch: {g['median']:.2f}x (range {g['min']:.2f}-{g['max']:.2f}); identical "
                     f"trajectories {res['gathered_identical_trajectories']}")
    net, cs = res["speedup_without_compiles"], res["compile_s"]
    lines.append(f"  without compile time (batch {cs['batch']} s, continuous {cs['continuous']} s per {unit}): "
                 f"{net['median']:.2f}x (range {net['min']:.2f}-{net['max']:.2f})")
    return "\n".join(lines)


def rollouts(res: dict) -> str:
    return _engine_vs_batch(res, f"rollouts: {res['questions']} questions of the {res['config']} config, "
                                 f"{res['slots']} rows, greedy", "round")


def grpo_rollouts(res: dict) -> str:
    return _engine_vs_batch(res, f"grpo_rollouts: {res['rounds']} GRPO steps' batches of {res['prompts_per_step']} "
                                 f"prompts × {res['group_size']} samples (T = {res['temperature']:g}), "
                                 f"{res['config'] or 'no'} warm start", "step")


def profile(res: dict) -> str:
    """bench.profile / profile_decode: per op class, ms per run and share on each side; the busiest matmul shapes."""
    from dart_jax.bench.profile import CLASSES
    sides = [k for k in ("dart_jax", "torch_concat_2r", "transformers") if k in res]
    head = (["op class"] + [f"{s} ms (share)" for s in sides] + ["dart_jax remat ms"]
            + [f"{s} GFLOP/s" for s in sides])
    rows = []
    for cls in CLASSES:
        got = [res[s]["classes"].get(cls) for s in sides]
        if not any(got):
            continue
        remat = (res["dart_jax"]["classes"].get(cls) or {}).get("remat_ms", 0.0)
        rows.append([cls] + [f"{g['ms']:.0f} ({100 * g['share']:.0f}%)" if g else "" for g in got]
                    + [f"{remat:.0f}" if remat else ""]
                    + [f"{g['gflops_per_s']:.0f}" if g and g["gflops_per_s"] else "" for g in got])
    rows.append(["ops summed / profiled wall / wall"]
                + [f"{res[s]['op_ms_per_update']:.0f} / {1e3 * res[s].get('profiled_wall_s', float('nan')):.0f} / "
                   f"{1e3 * res[s]['wall_s']:.0f}" for s in sides] + [""] * (len(sides) + 1))
    if res["bench"] == "profile_decode":
        title = (f"profile of a greedy decode, {res['model']} {res['dtype']}, {res['batch']} rows × "
                 f"{res['prompt_len']}-token prompts, {res['new_tokens']} new tokens each, prefill included, "
                 f"{res['runs']} profiled runs a side (ms per run; wall: one unprofiled run)")
    else:
        title = (f"profile of one GRPO update, {res['model']} {res['batch']}x{res['length']} fp32, remat "
                 f"{res['remat_policy']}, log-prob chunk {res['logprob_chunk']}, {res['runs']} profiled runs a side "
                 "(ms per update; wall: one unprofiled update)")
    out = [title, markdown_table(head, rows)]
    if res["dart_jax"].get("top_other_ops"):
        out.append("dart_jax: busiest other instructions")
        out.append(markdown_table(["instruction", "class", "ms", "shape", "source"],
                                  [[t["op"], t["class"], f"{t['ms']:.1f}", t["shape"], t["source"]]
                                   for t in res["dart_jax"]["top_other_ops"]]))
    for s in sides:
        out.append(f"{s}: busiest matmul shapes (M×K×N, batch× for batched)")
        out.append(markdown_table(["shape", "class", "ms", "calls", "GFLOP/s"],
                                  [[m["shape"], m["class"], f"{m['ms']:.1f}", m["calls"],
                                    f"{m['gflops_per_s']:.0f}" if m["gflops_per_s"] else ""]
                                   for m in res[s]["matmul_shapes"]]))
    return "\n".join(out)


def options(res: dict) -> str:
    """bench.options: each option's update time, speed-up over the default, and how far its numerics moved."""
    rows = []
    for name, o in res["options"].items():
        sp = o["speedup"]
        rows.append([name, f"{o['median_s']:.2f}", f"{sp['median']:.2f}× ({sp['min']:.2f}–{sp['max']:.2f})",
                     "" if o["loss_rel_diff"] is None else f"{o['loss_rel_diff']:.1e}",
                     f"{o['grad_norm_rel_diff']:.1e}"])
    return (f"GRPO update under XLA:CPU options, {res['model']} {res['batch']}x{res['length']}, one process per "
            f"option, {res['repeats']} interleaved rounds\n"
            + markdown_table(["option", "median s", "default / option", "loss rel. diff", "grad-norm rel. diff"], rows))


TEXT = {"forward": forward, "adapters": adapters, "sampler": sampler, "resume": resume, "cache_blocks": cache_blocks,
        "train": train, "prefill": prefill, "group_update": group_update, "handoff": handoff, "retrieval": retrieval,
        "methods": methods, "suite": suite, "corpus": corpus, "serve": serve, "rollouts": rollouts,
        "grpo_rollouts": grpo_rollouts, "profile": profile,
        "options": options, "matmul": matmul, "profile_decode": profile}


def text(which: str, res: dict) -> str:
    """The result of benchmark `which` as launch.bench prints it."""
    return TEXT[which](res)
