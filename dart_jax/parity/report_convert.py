"""The model and adapter cross-checks as CheckReports (quantity, tolerance for fp32 and bf16, pass)."""

from __future__ import annotations

from dart_jax.parity.report import CheckReport, Quantity

# fp32 / bf16 tolerances (the checks run in fp32; the bf16 column is what a bf16 run would be held to)
LOGIT = (1e-3, 1.5e-1)
GRAD = (1e-4, 5e-2)


def _q(name: str, kind: str, diff: float, scale: float, tols: tuple[float, float]) -> Quantity:
    q = Quantity(name, kind, diff, scale, tols[0], tols[1], False)
    q.passed = q.value <= tols[0]
    return q


def model_report(rep) -> CheckReport:
    greedy = Quantity("greedy continuation: tokens that differ", "abs", float(rep.greedy_tokens - rep.greedy_agree),
                      float(rep.greedy_tokens), 0, 0, rep.greedy_agree == rep.greedy_tokens)
    qs = [_q("logits (every non-pad position)", "abs", rep.max_abs_logit_diff, 0.0, LOGIT),
          _q("log-probs (every non-pad position)", "abs", rep.max_abs_logprob_diff, 0.0, LOGIT), greedy]
    settings = {"prompts": rep.num_prompts, "positions": rep.num_positions, "greedy_tokens": rep.greedy_tokens,
                "first_disagreement": rep.first_disagreement}
    return CheckReport("model", rep.model, "float32", "transformers", settings, [], qs, rep.seconds)


def adapters_report(rep) -> CheckReport:
    qs = [_q("routed logits", "abs", rep.max_abs_logit_diff, 0.0, LOGIT),
          _q("grad of the token-mean NLL w.r.t. every A, B", "abs", rep.max_abs_grad_diff, rep.max_abs_grad, GRAD)]
    settings = {"adapters": rep.adapters, "tokens": rep.num_tokens, "tokens_per_route": rep.tokens_per_route}
    return CheckReport("adapters", rep.model, "float32", "transformers + routed-LoRA hooks", settings, [], qs,
                       rep.seconds)
