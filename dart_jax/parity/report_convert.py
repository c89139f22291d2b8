"""The model and adapter cross-checks as CheckReports (quantity, tolerance for fp32 and bf16, pass)."""

from __future__ import annotations

from dart_jax.parity.check_report import TOLERANCES, CheckReport, Quantity


def _q(name: str, kind: str, diff: float, scale: float, key: str) -> Quantity:
    """Held to TOLERANCES[key] (the checks run in fp32; the bf16 column is what a bf16 run would be held to)."""
    _, t32, t16 = TOLERANCES[key]
    q = Quantity(name, kind, diff, scale, t32, t16, False)
    q.passed = q.value <= t32
    return q


def model_report(rep) -> CheckReport:
    greedy = Quantity("greedy continuation: tokens that differ", "abs", float(rep.greedy_tokens - rep.greedy_agree),
                      float(rep.greedy_tokens), 0, 0, rep.greedy_agree == rep.greedy_tokens)
    qs = [_q("logits (every non-pad position)", "abs", rep.max_abs_logit_diff, rep.max_abs_logit, "logits"),
          _q("log-probs (every non-pad position)", "abs", rep.max_abs_logprob_diff, rep.max_abs_logprob, "logits"),
          greedy]
    settings = {"prompts": rep.num_prompts, "positions": rep.num_positions, "greedy_tokens": rep.greedy_tokens,
                "first_disagreement": rep.first_disagreement}
    return CheckReport("model", rep.model, "float32", "transformers", settings, [], qs, rep.seconds)


def adapters_report(rep) -> CheckReport:
    qs = [_q("routed logits", "abs", rep.max_abs_logit_diff, rep.max_abs_logit, "logits"),
          _q("grad of the token-mean NLL w.r.t. every A, B", "abs", rep.max_abs_grad_diff, rep.max_abs_grad,
             "adapter_grad")]
    settings = {"adapters": rep.adapters, "tokens": rep.num_tokens, "tokens_per_route": rep.tokens_per_route}
    return CheckReport("adapters", rep.model, "float32", "transformers + routed-LoRA hooks", settings, [], qs,
                       rep.seconds)
