"""The lab's fourth GRPO study, stated before it ran. Three studies (configs/methods_lab.py,
methods_lab_signal.py, methods_lab_kl.py: nine seeded runs at lr 1e-3) moved no role skill beyond the
seed spread, and held-out accuracy fell on all nine (7/48 -> 1-4). The third showed a k3 KL term at the
paper's 0.001 too weak to pull the adapters back at that rate: KL kept rising over updates whose
advantage was zero on every row. The rate itself was chosen so that eight steps move the adapters at
all (the warm start's SFT rate); the seeds' spread at that rate is as large as any effect. This run
changes one thing: the rate, back to DART's embedded default 2e-4 (methods.lr_scale 1; the paper
trains its LoRAs at 1e-5 over far more, larger steps). Everything else is the third study's (groups
of 8 at T = 0.7, KL 0.001, 8 steps, seeds 0-2, the 48 held-out world-1 questions).

Stated before it ran (docs/results/lab.md, "The fourth study"):
  mechanism   the drift slows: pooled over the three seeds, held-out question-runs lost minus gained
              <= 3 (third study: 18 - 2), and the final actor/kl of every seed below the third study's
              lowest (0.034)
  primary     chain recall and reasoning skill on the 48 held-out questions, each seed vs the warm
              start (0.651, 0.133); "moved beyond seed spread" = every seed on the same side of the warm
              start by more than the seeds' range; secondary: accuracy paired by question (McNemar),
              tool skill, chain coverage, calls per question, mixed groups per step; the degeneracy
              gate on every evaluation

    python -m launch.methods --config=configs/methods_lab_lr.py     # every missing stage, resumable
"""

from configs import methods_lab, methods_lab_kl
from dart_jax.experiments.methods_run import METHODS, apply_method, relocate

OUT = "runs/methods_lab_lr"
ARCHIVE = "docs/results/data/lab/methods_lr/archive"
LR = METHODS["dart"]["lr"]  # 2e-4, DART's embedded default (the earlier studies scaled it 5x)


def get_config(arg: str | None = None):
    """arg: as configs/methods_lab.py (METHOD[,SEED])."""
    c = methods_lab_kl.get_config(arg)
    c.methods.lr_scale = 1.0  # every method at its own default rate: DART's is LR
    return relocate(apply_method(c, *methods_lab.run_arg(arg)), OUT, ARCHIVE)
