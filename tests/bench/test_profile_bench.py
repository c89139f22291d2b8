"""launch.bench profile: the HLO parser and op classes on hand-written HLO, and the profile of a tiny
model's update on both sides, checked by its matmul FLOPs — counted from the executed instructions'
shapes, they must equal the model's matmul work computed by hand (exact integers, no tolerance on
the count; 1e-9 relative for float summation)."""

import math

import pytest

from dart_jax.bench.profile import classify_instr, classify_torch, dims, parse_hlo

HLO = """HloModule jit_step, entry_computation_layout={(f32[8,16]{1,0})->f32[8,4]{1,0}}

%fused_dot (param_0: f32[8,16], param_1: f32[16,300]) -> f32[8,300] {
  %param_0 = f32[8,16]{1,0} parameter(0)
  %param_1 = f32[16,300]{1,0} parameter(1)
  ROOT %dot.1 = f32[8,300]{1,0} dot(%param_0, %param_1), lhs_contracting_dims={1}, rhs_contracting_dims={0}
}

%fused_attn (param_0.1: f32[2,8,4], param_1.1: f32[2,4,8]) -> f32[2,8,8] {
  %param_0.1 = f32[2,8,4]{2,1,0} parameter(0)
  %param_1.1 = f32[2,4,8]{2,1,0} parameter(1)
  ROOT %dot.2 = f32[2,8,8]{2,1,0} dot(%param_0.1, %param_1.1), lhs_batch_dims={0}, lhs_contracting_dims={2}, rhs_batch_dims={0}, rhs_contracting_dims={1}
}

%fused_lse (param_0.2: f32[8,1000]) -> f32[8] {
  %param_0.2 = f32[8,1000]{1,0} parameter(0)
  %exponential.1 = f32[8,1000]{1,0} exponential(%param_0.2)
  %constant.1 = f32[] constant(0)
  ROOT %reduce.1 = f32[8]{0} reduce(%exponential.1, %constant.1), dimensions={1}, to_apply=%add
}

%fused_copy (param_0.3: f32[8,300]) -> f32[300,8] {
  %param_0.3 = f32[8,300]{1,0} parameter(0)
  ROOT %transpose.1 = f32[300,8]{1,0} transpose(%param_0.3), dimensions={1,0}
}

ENTRY %main.9 (Arg_0.1: f32[8,16], Arg_1.1: f32[16,300]) -> f32[8,300] {
  %Arg_0.1 = f32[8,16]{1,0} parameter(0)
  %Arg_1.1 = f32[16,300]{1,0} parameter(1)
  %ynn_fusion = f32[8,300]{1,0} fusion(%Arg_0.1, %Arg_1.1), kind=kCustom, calls=%fused_dot, metadata={op_name="jit(step)/checkpoint/rematted_computation/dot_general"}
  %t = f32[300,8]{1,0} fusion(%ynn_fusion), kind=kLoop, calls=%fused_copy
  ROOT %dot.3 = f32[8,300]{1,0} dot(%Arg_0.1, %Arg_1.1), lhs_contracting_dims={1}, rhs_contracting_dims={0}
}
"""  # noqa: E501 (HLO: one instruction a line)


def test_hlo_instructions_are_parsed_and_classified():
    instrs, comps = parse_hlo(HLO)
    assert {"ynn_fusion", "dot.1", "dot.2", "reduce.1", "dot.3", "t"} <= set(instrs)
    f = instrs["ynn_fusion"]
    assert f.opcode == "fusion" and f.calls() == ["fused_dot"] and "rematted_computation" in f.op_name
    assert dims(f.shape) == [8, 300] and f.operands == ["Arg_0.1", "Arg_1.1"]
    # a fusion around a dot: its FLOPs from the called computation's shapes (2·M·K·N), K = 16 ≤ 64: a LoRA-shaped dot
    cls, flops, mkn = classify_instr(f, instrs, comps, vocab=1000)
    assert (cls, flops, mkn) == ("matmul: LoRA", 2.0 * 8 * 16 * 300, (1, 8, 16, 300))
    # the same dot at the top level
    assert classify_instr(instrs["dot.3"], instrs, comps, vocab=1000)[1] == 2.0 * 8 * 16 * 300
    # a batched dot: attention, FLOPs over the batch
    attn = parse_hlo(HLO.replace("calls=%fused_dot", "calls=%fused_attn"))
    cls, flops, mkn = classify_instr(attn[0]["ynn_fusion"], *attn, vocab=1000)
    assert (cls, flops, mkn) == ("attention", 2.0 * 2 * 8 * 4 * 8, (2, 8, 4, 8))
    # a vocabulary-wide exp + reduce: log-probs; the vocab dimension on a dot: the head
    lse = parse_hlo(HLO.replace("calls=%fused_dot", "calls=%fused_lse"))
    assert classify_instr(lse[0]["ynn_fusion"], *lse, vocab=1000)[0] == "log-probs"
    assert classify_instr(f, instrs, comps, vocab=300)[0] == "matmul: head"
    assert classify_instr(instrs["t"], instrs, comps, vocab=1000)[0] == "copies / layout"


def test_torch_ops_are_classified_by_shape():
    assert classify_torch("aten::mm", [[128, 576], [576, 1536]], 49152) == (
        "matmul: projections", 2.0 * 128 * 576 * 1536, (1, 128, 576, 1536))
    assert classify_torch("aten::addmm", [[1536], [128, 576], [576, 1536]], 49152)[0] == "matmul: projections"
    assert classify_torch("aten::mm", [[128, 576], [576, 16]], 49152)[0] == "matmul: LoRA"
    assert classify_torch("aten::mm", [[128, 576], [576, 49152]], 49152)[0] == "matmul: head"
    assert classify_torch("aten::bmm", [[36, 64, 512], [36, 512, 64]], 49152)[0] == "attention"
    assert classify_torch("aten::_log_softmax", [[4, 511, 49152]], 49152)[0] == "log-probs"
    assert classify_torch("aten::copy_", [[4, 4]], 49152)[0] == "copies / layout"
    assert classify_torch("aten::mul", [[4, 4]], 49152)[0] == "elementwise / other"


@pytest.mark.parametrize("chunk", [128, 16])
def test_profile_counts_the_models_matmul_work_on_both_sides(tmp_path, chunk):
    """Frozen base, so the backward multiplies activations only: each projection runs twice per token
    (forward, input gradient) = 4·P·tokens FLOPs; each LoRA factor three times (forward, input
    gradient, its own gradient), for both rank-8 adapters on every token (DART selects per token after
    both run); attention's two batched matmuls six times. The head sees the T − 1 positions that have a
    next token, padded to whole log-prob chunks: with one chunk XLA merges the remat's recomputed head
    matmul with the forward's (two head matmuls), with several it runs it (three, under remat).
    torch's model runs the head on all T positions and prunes layer 0's q/k/v input gradients (the
    embeddings need none), which XLA's scanned layers still compute."""
    pytest.importorskip("torch")
    import tiny_models
    from dart_jax.bench.profile import CLASSES, bench_profile
    from dart_jax.bench.report import text

    D, F, V, L, N, K, H, R = 256, 512, 1000, 2, 4, 2, 64, 8
    tiny_models.build("llama", str(tmp_path), vocab_size=V, hidden_size=D, intermediate_size=F,
                      num_attention_heads=N, num_key_value_heads=K, max_position_embeddings=256, num_hidden_layers=L,
                      bos_token_id=1, eos_token_id=2, pad_token_id=2)
    B, T = 2, 64
    res = bench_profile(str(tmp_path), batch=B, length=T, runs=1, logprob_chunk=chunk)
    proj = L * (D * (N + 2 * K) * H + N * H * D + 3 * D * F)
    qkv_in = 2 * B * T * D * (N + 2 * K) * H                      # layer 0's q/k/v input gradient
    lora_fwd = L * 2 * B * T * 2 * R * (2 * 2 * D + 2 * (D + K * H) + 3 * (D + F))  # q o, k v, gate up down; 2 adapters
    lora_in0 = 2 * B * T * 2 * R * 3 * D                          # layer 0's q/k/v LoRA input gradient
    positions = -(-(T - 1) // chunk) * chunk if chunk < T - 1 else T - 1
    ours, theirs = res["dart_jax"], res["torch_concat_2r"]
    gflop = lambda side, cls: side["classes"][cls]["gflop"] * 1e9  # noqa: E731
    assert gflop(ours, "matmul: projections") == pytest.approx(4 * proj * B * T, rel=1e-9)
    assert gflop(ours, "matmul: LoRA") == pytest.approx(3 * lora_fwd, rel=1e-9)
    # attention: 2 forward matmuls, 5 in the hand-written backward (the scores recomputed, dv, dp, dq, dk)
    assert gflop(ours, "attention") == pytest.approx(L * 7 * 2 * B * N * T * T * H, rel=1e-9)
    # the logits, their gradient's input product and (several chunks) the logits recomputed by the
    # log-probs' backward; with one chunk XLA reuses the forward's logits
    head_matmuls = 2 if chunk >= T - 1 else 3
    assert gflop(ours, "matmul: head") == pytest.approx(head_matmuls * 2 * D * V * B * positions, rel=1e-9)
    assert gflop(theirs, "matmul: projections") == pytest.approx(4 * proj * B * T - qkv_in, rel=1e-9)
    assert gflop(theirs, "matmul: LoRA") == pytest.approx(3 * lora_fwd - lora_in0, rel=1e-9)
    assert gflop(theirs, "matmul: head") == pytest.approx(4 * D * V * B * T, rel=1e-9)
    for side in (ours, theirs):
        assert set(side["classes"]) <= set(CLASSES)
        assert {"log-probs", "loss", "optimizer", "attention"} <= set(side["classes"])  # attributed by source
        assert math.isclose(sum(c["share"] for c in side["classes"].values()), 1.0, rel_tol=1e-9)
        assert side["wall_s"] > 0 and side["matmul_shapes"]
    assert "LoRA routing / scale" in ours["classes"]
    assert ours["unmatched_ms"] == 0.0  # every executed instruction was found in the compiled module
    assert "| matmul: projections |" in text("profile", res)
    assert all(side["profiled_wall_s"] > 0 for side in (ours, theirs))


def test_options_are_refused_before_any_worker_starts(tmp_path):
    """A mistaken --options list is one line naming the known options, with nothing started or written."""
    from launch.bench import main
    for bad in ("bf16,default", "default,fastest"):
        with pytest.raises(SystemExit, match="must start with default.*ynn_eltwise"):
            main(["options", f"--options={bad}", f"--model={tmp_path}", f"--json={tmp_path / 'o.json'}"])
    assert not (tmp_path / "o.json").exists()


@pytest.mark.slow  # ~40 s beside another group: three worker processes each compile the update (the
# refusal of a mistaken --options list is the test above, in the default run)
def test_options_bench_interleaves_worker_processes_and_shows_the_numerics(tmp_path):
    """launch.bench options: one worker process per option, each with its own XLA flags, timed in
    interleaved rounds; YNNPACK's elementwise fusion keeps the default's loss and gradient norm (fp32,
    the same updates: ≤ 1e-5 relative), bf16 compute moves them (> 1e-4) — shown, not hidden."""
    import tiny_models
    from dart_jax.bench.report import text
    from dart_jax.bench.xla_options import bench_options

    tiny_models.build("llama", str(tmp_path), vocab_size=1000, hidden_size=128, intermediate_size=256,
                      num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=256, num_hidden_layers=2,
                      bos_token_id=1, eos_token_id=2, pad_token_id=2)
    res = bench_options(str(tmp_path), batch=2, length=64, repeats=2, options=("default", "ynn_eltwise", "bf16"))
    o = res["options"]
    assert list(o) == ["default", "ynn_eltwise", "bf16"]
    assert all(len(v["times_s"]) == 2 and v["median_s"] > 0 for v in o.values())
    assert "--xla_cpu_experimental_ynn_fusion_type=+eltwise" in o["ynn_eltwise"]["xla_flags"]
    assert "ynn_fusion_type" not in o["default"]["xla_flags"]
    assert o["default"]["loss_rel_diff"] == 0.0 and o["default"]["speedup"]["median"] == 1.0
    assert o["ynn_eltwise"]["loss_rel_diff"] <= 1e-5 and o["ynn_eltwise"]["grad_norm_rel_diff"] <= 1e-5
    assert o["bf16"]["grad_norm_rel_diff"] > 1e-4
    assert "| ynn_eltwise |" in text("options", res)


def test_decode_profile_counts_the_models_matmul_work_on_both_sides(tmp_path):
    """launch.bench profile_decode on a tiny model: B prompts of T tokens each decode `new` tokens, greedy.
    Both sides forward the B·T prompt tokens once and then B tokens a step for new − 1 steps (the first
    new token comes from the prefill's last position), and apply the head to one position a row each
    time: projections 2·P·B·(T + new − 1), head 2·D·V·B·new FLOPs, counted from the executed
    instructions' shapes (ours: the prefill's and the decode loop's modules; torch: aten ops). With
    M = B = 2 rows every projection stays a projection (not a LoRA factor: no adapter is loaded)."""
    pytest.importorskip("torch")
    import tiny_models
    from dart_jax.bench.profile_decode import bench_profile_decode
    from dart_jax.bench.report import text

    D, F, V, L, N, K, H = 256, 512, 1000, 2, 4, 2, 64
    tiny_models.build("llama", str(tmp_path), vocab_size=V, hidden_size=D, intermediate_size=F,
                      num_attention_heads=N, num_key_value_heads=K, max_position_embeddings=256, num_hidden_layers=L,
                      bos_token_id=1, eos_token_id=2, pad_token_id=2)
    B, T, new = 2, 16, 8
    res = bench_profile_decode(str(tmp_path), batch=B, new_tokens=new, prompt_len=T, runs=1)
    proj = L * (D * (N + 2 * K) * H + N * H * D + 3 * D * F)
    gflop = lambda side, cls: side["classes"][cls]["gflop"] * 1e9  # noqa: E731
    for side in (res["dart_jax"], res["transformers"]):
        assert gflop(side, "matmul: projections") == pytest.approx(2 * proj * B * (T + new - 1), rel=1e-9)
        assert gflop(side, "matmul: head") == pytest.approx(2 * D * V * B * new, rel=1e-9)
        assert "matmul: LoRA" not in side["classes"] and "attention" in side["classes"]
        assert math.isclose(sum(c["share"] for c in side["classes"].values()), 1.0, rel_tol=1e-9)
        assert side["wall_s"] > 0 and side["profiled_wall_s"] > 0
    # every instruction of the two profiled modules was found; what is left are the eager helpers run() calls
    # (jnp.ones, a PRNG key, the prompt-length check), named by module
    left = res["dart_jax"]["unmatched_modules"]
    assert not any("prefill" in m or "decode" in m for m in left), left
    assert sum(left.values()) == pytest.approx(res["dart_jax"]["unmatched_ms"])
    assert res["tokens_decoded"] == B * new
    assert text("profile_decode", res).startswith("profile of a greedy decode")
