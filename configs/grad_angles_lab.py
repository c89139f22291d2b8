"""Gradient alignment in the lab (the paper's gradient-alignment analysis where both roles are real skills), sized
for 2 CPU cores.

    python -m launch.grad_angles --config=configs/grad_angles_lab.py      # sample, grads, report

The policy is the lab warm start (SmolLM2-135M-Instruct with `data/warm_start/smollm2-135m-lab` merged in:
its queries name entities, its reasoning carries values; docs/results/lab.md), sampled G = 8 times per
question at T = 1 on lab world 0's RL difficulty (h = 2-3, every operation, cells taken in turn), with the lab's
tool (lexical top-1 over world 0's corpus, six calls), 8 questions at a time until 16 questions have mixed
outcomes. Gradients: a fresh shared rank-16 LoRA on all seven projections of every layer (exact Gram
matrices), the paper's per-trajectory protocol, and the role-agnostic control (`control`): each trajectory's
generated tokens split at random into two sets of the reasoning and tool roles' sizes, so the cross-role angle
is compared with what any two token sets of the same trajectory give.

Stated before the runs (2026-12-06):

- **Primary test:** per question, the median cross-role angle (reasoning vs tool gradient of one trajectory)
  minus the median same-role angle between distinct trajectories, under the sign-free log-likelihood
  weighting, for each role (one-sided Wilcoxon over questions, cross > same; bootstrap 95% CI of the median
  difference). The paper's claim reads as cross > same for both roles.
- **Control (secondary):** per question, the median cross-role angle minus the median angle between the two
  random token sets of one trajectory (same test). If the roles' gradients were no more apart than any two
  token sets of a trajectory, this difference would be ~0.
- **Secondary:** the advantage weighting (its same-role angles flip with the sign of the advantages), the
  per-layer angles; the degeneracy gate on the sampled texts.

Budget: 16 questions × G = 8 (the NQ study: 32 × 16) because a lab trajectory is ~2.5× an NQ one and the
control doubles the backward passes (4 per trajectory); the authors' protocol and `params=full` are left to a
larger machine (`--params=full --protocol=authors` run them from the same rollouts).
"""

from ml_collections import ConfigDict

from configs import lab_quickstart


def get_config(arg: str | None = None):
    c = lab_quickstart.get_config()
    c.method.variant = "lora"  # the warm start alone; params=adapters adds the fresh shared LoRA below
    c.train.pad_multiple = 64
    c.grad_angles = ConfigDict(dict(
        out="runs/grad_angles_lab", datasets=["lab_world0"], limit=240, queries=16, chunk=8,
        group_size=8, temperature=1.0, seed=0, params=["adapters"], protocols=["paper"],
        adapter_rank=16, exact_max_gb=2.0, sketch_dim=16384, sketch_seed=0, authors_k=5, min_n=10,
        control=True))
    return c
