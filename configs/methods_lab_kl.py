"""The lab's third GRPO study, stated before it ran. The second (configs/methods_lab_signal.py: groups of
8 at T = 0.7) doubled the groups with mixed outcomes (12 of 48), but 10 of the 12 came in steps 1–4;
from step 5 the training reward was 0 on 10 of 12 seed-steps, held-out accuracy fell on every seed
(7/48 -> 4, 1, 2) and no role skill moved beyond the seed spread. With no KL term, a step whose
groups all score alike has zero policy gradient, yet Adam's momentum keeps moving the adapters. This
run changes one thing: a k3 KL term to the warm start (adapters off) at the paper's coefficient,
0.001 — with Adam, a step without reward variance then moves the adapters back toward the warm start.

Stated before it ran (docs/results/lab.md, "The third study"):
  mechanism   the KL term is active (actor/kl > 0 at every step after the first update that moved the
              adapters; amended at step 2 of seed 0, before any evaluation: the run starts at the
              reference, so KL is 0 until an update with a non-zero advantage) and held-out accuracy stops falling:
              pooled over the three seeds, question-runs lost minus gained ≤ 3 (second study: 15 - 1)
  primary     chain recall (the tool role per trajectory: share of the gold chain retrieved; the
              second study showed tool skill per call rises as calls fall) and reasoning skill on
              the 48 held-out world-1 questions, each seed vs the warm start (0.651, 0.133), "moved
              beyond seed spread" = every seed on the same side of the warm start by more than the
              seeds' range; secondary: accuracy paired by question (McNemar), tool skill, chain
              coverage, calls per question, the mixed groups per step; the degeneracy gate on every
              evaluation

    python -m launch.methods --config=configs/methods_lab_kl.py     # every missing stage, resumable
"""

from configs import methods_lab_signal
from dart_jax.experiments.methods_run import relocate

OUT = "runs/methods_lab_kl"
ARCHIVE = "docs/results/data/lab/methods_kl/archive"
KL_COEF = 0.001


def get_config(arg: str | None = None):
    """arg: as configs/methods_lab.py (METHOD[,SEED])."""
    c = methods_lab_signal.get_config(arg)
    c.loss.kl_coef = KL_COEF
    return relocate(c, OUT, ARCHIVE)
