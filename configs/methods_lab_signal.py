"""The lab's second GRPO study, stated before it ran: the first (configs/methods_lab.py) gave GRPO almost
no reward variance — at T = 1, 2–8% of sampled trajectories were rewarded and only 2–5 of a run's 32
groups of four had mixed outcomes — and no role skill moved beyond the seed spread. This run changes
only what decides that variance, at the same cost per step (16 trajectories): groups of 8 samples of
2 prompts, sampled at T = 0.7 (nearer the greedy policy that answers 15% of held-out questions; the
loss's log-probs at the same temperature, verl's convention, as configs/quickstart_sql.py).

Stated before it ran (docs/results/lab.md, "The second study"):
  mechanism   mixed groups per run (of 16) at least double the first study's share (5, 2, 5 of 32)
  primary     tool skill on the 48 held-out world-1 questions, each seed vs the warm start (0.635), and
              its spread over the three seeds; secondary: accuracy paired by question (McNemar), chain
              coverage, reasoning skill; the degeneracy gate on every evaluation
  reading     "moved beyond seed spread" = every seed on the same side of the warm start, by more than
              the seeds' range

    python -m launch.methods --config=configs/methods_lab_signal.py     # every missing stage, resumable
"""

from configs import methods_lab
from dart_jax.experiments.methods_run import relocate

OUT = "runs/methods_lab_signal"
ARCHIVE = "docs/results/data/lab/methods_signal/archive"
TEMPERATURE = 0.7


def get_config(arg: str | None = None):
    """arg: as configs/methods_lab.py (METHOD[,SEED])."""
    c = methods_lab.get_config(arg)
    c.train.prompts_per_step = 2
    c.train.group_size = 8
    c.sampling.temperature = TEMPERATURE
    c.loss.temperature = TEMPERATURE
    return relocate(c, OUT, ARCHIVE)
