"""`launch.crosscheck` on a tiny random Llama with SmolLM2's real tokenizer: all four subcommands pass
at fp32 tolerances, reports are written, the --reference switch changes both sides and names every
difference, and the PyTorch reference is independent of our JAX code."""

import ast
import json
import os

import pytest

from launch import crosscheck

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def _run(argv, out):
    code = crosscheck.main(argv + ["--out", str(out)])
    rep = json.load(open(out / "report.json"))
    assert os.path.isfile(out / "report.md")
    return code, rep


def test_model_and_adapters_subcommands(tiny_smollm_dir, tmp_path):
    code, rep = _run(["model", "--model", tiny_smollm_dir, "--max-new-tokens", "8"], tmp_path / "m")
    assert code == 0 and rep["pass"] and rep["check"] == "model"
    code, rep = _run(["adapters", "--model", tiny_smollm_dir], tmp_path / "a")
    assert code == 0 and rep["pass"], rep
    grad = next(q for q in rep["quantities"] if q["name"].startswith("grad"))
    assert grad["scale"] > 0  # fresh adapters with B ≠ 0: the gradients are not trivially zero


def test_loss_subcommand_with_the_search_r1_reference(tiny_smollm_dir, tmp_path):
    code, rep = _run(["loss", "--model", tiny_smollm_dir, "--reference", "search_r1", "--temperature", "0.7"],
                     tmp_path / "l")
    assert code == 0 and rep["pass"], [q for q in rep["quantities"] if not q["passed"]]
    names = [q["name"] for q in rep["quantities"]]
    for mode in ("token-mean", "seq-mean-token-sum", "seq-mean-token-mean", "seq-mean-token-sum-norm"):
        assert f"pg_loss [{mode}]" in names and f"kl [{mode}]" in names
        assert f"grad (A, B of both adapters) [{mode}, verl_microbatch_mean]" in names
    assert "grad (A, B of both adapters) [token-mean, global]" in names
    assert rep["settings"]["kl_clamp"] is False and rep["settings"]["entropy_coef"] == 0.001
    assert rep["settings"]["clipped_share"] > 0.1  # the ratio clip acts on this batch
    diffs = "\n".join(rep["differences"])
    for field in ("loss.micro_mode", "loss.kl_clamp", "loss.entropy_coef", "sampling.top_p",
                  "rollout.invalid_action", "rollout.max_obs_tokens"):
        assert field in diffs
    grads = [q for q in rep["quantities"] if q["name"].startswith("grad")]
    assert all(q["scale"] > 0 for q in grads)


def test_step_subcommand(tiny_smollm_dir, tmp_path):
    code, rep = _run(["step", "--model", tiny_smollm_dir], tmp_path / "s")
    assert code == 0 and rep["pass"], [q for q in rep["quantities"] if not q["passed"]]
    assert rep["settings"]["warmup_steps"] == 2 and rep["settings"]["clip_norm"] > 0
    names = [q["name"] for q in rep["quantities"]]
    assert "update 1: parameters (lr 0, must not move)" in names  # verl's warmup: the first update has lr 0
    assert any(n.startswith("update 3 (lr 1.0e-03)") for n in names)


def test_a_failing_quantity_fails_the_command(tmp_path, monkeypatch):
    from dart_jax.parity.report import CheckReport, quantity
    good = quantity("advantages", "advantages", [0.5], [0.5], "float32")
    bad = quantity("log-probs", "logp", [1.0], [0.0], "float32")
    assert good.passed and not bad.passed
    fake = CheckReport("loss", "m", "float32", "verl", {}, ["x: a → b"], [good, bad], 0.0)
    monkeypatch.setattr(crosscheck, "run", lambda args: fake)
    code, rep = _run(["loss", "--model", "m"], tmp_path / "f")
    assert code == 1 and not rep["pass"] and "FAIL" in open(tmp_path / "f" / "report.md").read()


def test_torch_reference_is_independent_of_our_jax_code():
    tree = ast.parse(open(os.path.join(REPO, "dart_jax", "parity", "torch_grpo.py")).read())
    imported = {a.name for n in ast.walk(tree) if isinstance(n, ast.Import) for a in n.names}
    imported |= {n.module for n in ast.walk(tree) if isinstance(n, ast.ImportFrom)}
    assert imported <= {"__future__", "math", "torch"}, imported


def test_unknown_reference_is_refused():
    from dart_jax.parity.references import loss_overrides
    with pytest.raises(ValueError, match="expected one of"):
        loss_overrides("openrlhf")


def test_loss_in_bf16_is_held_against_pytorchs_own_bf16_error(tiny_smollm_dir):
    from dart_jax.parity.grpo_check import crosscheck_loss
    rep = crosscheck_loss(tiny_smollm_dir, dtype="bfloat16")
    assert rep.passed, [(q.name, q.value, q.tol_bf16) for q in rep.quantities if not q.passed]
    grads = [q for q in rep.quantities if q.name.startswith("grad (A, B")]
    assert grads and all(q.value > 1e-3 for q in grads)  # bf16 really differs from fp32 ...
    assert all(q.value <= q.tol_bf16 for q in grads) and "bf16" in rep.settings["bf16_rule"]
