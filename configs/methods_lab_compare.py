"""The method comparison in the lab, stated before it ran: DART against LoRA-16 (one shared rank-16
adapter on every token, the paper's single-LoRA baseline) under the fourth GRPO study's settings
(configs/methods_lab_lr.py: groups of 8 at T = 0.7, k3 KL 0.001, 8 steps of 16 trajectories, every
method at its own default rate: 2e-4 for both), seeds 0-2, evaluated greedily on the 48 held-out
world-1 questions (4 per (hops, operation) cell) beside the warm start both start from. DART's three
runs are the fourth study's, read from its archive (the same configuration, checked run by run); the
LoRA-16 runs are trained here and archived beside them.

Stated before it ran (docs/results/lab.md, "DART against LoRA-16"):
  primary     DART minus LoRA-16 in held-out accuracy, averaged over the three seeds, paired over the
              48 questions; its 95% interval from a bootstrap over seeds x questions (seeds resampled
              as DART / LoRA-16 pairs, which share the data order, then questions; 10,000 resamples).
              "DART differs" = the interval excludes 0.
  secondary   each seed's DART vs LoRA-16 and each run vs the warm start paired by question (McNemar);
              per method the role skills (tool skill, chain recall, chain coverage, reasoning skill)
              with their seed ranges; calls per question; mixed groups per step; the degeneracy gate on
              every evaluation
  budget      two of the paper's five methods (MixLoRA, full, 2-Agent are one flag away:
              --config.methods.methods=dart,lora16,mixlora,full,2agent_lora), 3 seeds, 48 questions
              greedy: what 2 cores allow beside the other studies (a LoRA-16 run: ~35 min of training)

Added 2026-12-07, stated before its runs (docs/results/lab.md, "DART against full fine-tuning"): full
(every parameter, the paper's Search-R1 baseline, at the full-parameter rate 2e-5 and Search-R1's invalid-
action policy, as in METHODS), seeds 0-2, the same steps and questions. The primary test above is
unchanged; DART minus full is secondary (the same seeds x questions bootstrap; the paper: DART 40.5 vs
Search-R1 30.3 average EM, 3B-Base), with full's role skills beside DART's.

Added 2026-12-07 18:20, stated before their runs (docs/results/lab.md, "DART against MixLoRA and
2-Agent-LoRA"): mixlora (rank-8 attention LoRAs + 2 rank-8 FFN experts, top-2, load balancing 0.001) and
2agent_lora (two rank-8 LoRAs over the frozen base, one per role, each trained only on its role's
tokens), both at 2e-4, seeds 0-2, the same steps and questions. The primary test is unchanged; DART
minus MixLoRA and DART minus 2-Agent-LoRA are secondary (the same seeds x questions bootstrap; the
paper: MixLoRA 32.5 average EM on 3B-Base's QA table, 2-Agent 40.6 in the ablation), with their role
skills and McNemar against the warm start. 2-Agent with two full models is left out: two full-parameter
runs' state (13 P) and ~2x full's steps, which took 4-17 min each here (corrected after the full runs:
those were medians with the host's pauses; unpaused steps took 2-5 min, docs/results/lab.md).

    python -m launch.methods --config=configs/methods_lab_compare.py     # every missing stage, resumable
"""

from configs import methods_lab, methods_lab_lr
from dart_jax.experiments.methods_run import apply_method, relocate

OUT = "runs/methods_lab_compare"
ARCHIVE = methods_lab_lr.ARCHIVE  # DART's runs and the warm start's evaluation are the fourth study's
REPORT = "docs/results/data/lab/methods_compare/report"
METHODS = "dart,lora16,full,mixlora,2agent_lora"


def get_config(arg: str | None = None):
    """arg: as configs/methods_lab.py (METHOD[,SEED])."""
    c = methods_lab_lr.get_config(arg)
    c.methods.methods = METHODS
    c.methods.report = REPORT
    return relocate(apply_method(c, *methods_lab.run_arg(arg)), OUT, ARCHIVE)
