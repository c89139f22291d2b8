"""Gradient alignment on the embedded default (the paper's gradient-alignment analysis), sized for 2 CPU cores.

    python -m launch.grad_angles --config=configs/grad_angles_quickstart.py

SmolLM2-135M-Instruct with the shipped NQ warm start merged into its weights (the policy the CEA
quickstart starts from); G = 16 rollouts per query at T = 1 on held-out NQ questions whose gold
passage is in the shipped corpus (`nq_corpus_heldout`, the CEA quickstart's setting), sampled 8
queries at a time until `queries` groups have mixed outcomes (some EM right, some wrong). In this
setting the warm start's search query is the question itself in ~90% of calls (measured on the
first 512 rollouts), so the tool role's tokens are mostly a copy of the prompt: a limit of the
setting, reported with the finding (HotpotQA would need a multi-hop warm start). Both protocols, both
parameter sets: `full` (all 135M backbone parameters; per-trajectory gradients are compared through
a CountSketch of 16,384 buckets per unit, since 32 full gradient trees do not fit beside the
model on this machine) and `adapters` (a shared rank-16 LoRA on every linear layer, exact).
"""

from ml_collections import ConfigDict

from configs import base
from configs.sft_quickstart import shared

WARM_START = "data/warm_start/smollm2-135m-nq"


def get_config(arg: str | None = None):
    c = shared(base.get())
    c.warm_start = WARM_START
    c.method.variant = "lora"
    c.train.pad_multiple = 64
    c.grad_angles = ConfigDict(dict(
        out="runs/grad_angles_quickstart", datasets=["nq_corpus_heldout"], limit=253, queries=32, chunk=8,
        group_size=16, temperature=1.0, seed=0, params=["adapters", "full"], protocols=["paper", "authors"],
        adapter_rank=16, exact_max_gb=2.0, sketch_dim=16384, sketch_seed=0, authors_k=5, min_n=10,
        # the role-agnostic control (each trajectory's tokens split at random into sets of the roles' sizes,
        # the paper protocol's Gram doubled): configs/grad_angles_lab.py runs it; off here, as the shipped study ran
        control=False))
    return c
