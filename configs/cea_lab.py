"""CEA in the lab, stated before it runs: the paper's interference diagnostic where both roles are
skills (a generated multi-hop world; docs/results/lab.md), with training seeds, a screen for
identifiable questions, a clip-free estimator and a seed noise floor.

    python -m launch.cea --config=configs/cea_lab.py                       # every missing stage, resumable
    python -m launch.cea --config=configs/cea_lab.py --stage=screen        # one stage: screen|train|sample|solve
    python -m launch.train --config=configs/cea_lab.py:tool,1              # one variant's training, one seed
    python -m launch.cea --config=configs/cea_lab.py --stage=solve --interference-only   # the primary (β23) from
                                  # the single-model variants alone (the sample stage also writes it, solve_b23/,
                                  # once they are sampled and before the compositions)

Variants. M_Base = SmolLM2-135M-Instruct with the lab warm start merged in. M_Reas / M_Tool / M_Unified =
full-parameter GRPO from M_Base (`paper` roles: tool = the tokens inside <search> … </search>, reasoning =
every other generated token, unified = all) with the fourth lab GRPO study's data and sampling
(configs/methods_lab_lr.py: lab world 0 at two and three hops over its own corpus, groups of 8 at T = 0.7,
k3 KL 0.001 to M_Base, 8 steps; the batch engine, which H_Tool / H_Reas need) at the comparison's
full-parameter rate 2e-5; each trained with seeds
0, 1, 2 (`cea.train_seeds`), which change the data order and the sampling, nothing else. H_Tool /
H_Reas are composed per seed.

Questions. The screen samples M_Base 8 times at T = 1 (screen seed 1, not the sample seed) on the first
96 held-out world-1 questions (hops 2–3, the (hops, operation) cells in turn) and keeps those it answers
1 to 7 times of 8; while fewer than 32 are kept it screens the next 96, up to 288 (`screen.max_limit`,
added 2026-12-07 before the screen ran: a throughput check of M_Base at T = 1, not part of the study, drew
0 right answers in 64 on 4 questions, and the lab's T = 1 training samples were rewarded 2–8% of the
time, so 96 may keep fewer than 32); the six variants × three seeds then sample 24 answers at T = 1 on
the first 32 kept.

Stated before the run:
  primary     β23 under the Jeffreys estimator ((k + ½) / (n + 1): no clip), averaged over questions and
              seeds, with a 95% percentile interval from a bootstrap over seeds × questions (10,000
              resamples). "Interference" = the interval lies below 0; "none detected" = it holds 0.
  secondary   β23 per seed (Jeffreys and the paper's clip); questions whose β23 sign is decided at 90%
              posterior probability; the seed noise floor (M_Unified of two seeds, per-question logit
              difference); β23 per (hops, operation) cell; β1..β13; each variant's lab role skills
              (tool skill, chain recall, reasoning skill) and accuracy.
  cost        not run on 2 cores; estimated from the lab's measured costs (8 lab steps of DART / LoRA-16:
              30–45 min; 512 lab trajectories: ~1.5 h) at 9 training runs and 16 samples of 32 × 24
              trajectories — about 35 hours there; on one accelerator, a few hours. Since written: M_Unified's
              three trainings are the method comparison's full runs (the same run configuration; `cea.adopt`
              links them once finished, after checking it), and the batch loop gathers its running rows
              (1.26x on the lab's rollouts): about 6 of the 9 trainings and 3/4 of the sampling remain.
              Measured 2026-12-07 (M_Base, 4 questions × 16 samples at T = 1, alone, no compiles): 187 s at
              batch 32 against 217 s at batch 64, so 768 trajectories take ~37 min of a single model at
              batch 32 — about 10 h for the 16 samples (the compositions run two models) and 0.6–2 h for the
              screen, beside ~4 h for the six trainings.
"""

from ml_collections import ConfigDict

from configs import methods_lab_compare, methods_lab_lr
from configs.cea import ROLE_MASK, role_masks

OUT = "runs/cea_lab"
SEEDS = "0,1,2"


def get_config(arg: str | None = None):
    """arg: "" (the study: launch.cea) | VARIANT[,SEED] (reas | tool | unified: that variant's training
    config for launch.train, seed 0 unless given)."""
    parts = [p.strip() for p in (arg or "").split(",") if p.strip()]
    variant = parts[0] if parts else "unified"
    if len(parts) > 2 or variant not in ROLE_MASK["paper"]:
        raise ValueError(f"configs/cea_lab.py:{arg}: expected [reas|tool|unified[,SEED]]")
    seed = int(parts[1]) if len(parts) > 1 else 0
    c = methods_lab_lr.get_config(f"full,{seed}")  # the fourth study's run of full-parameter GRPO
    del c["methods"]
    c.method.role_mask = ROLE_MASK["paper"][variant]
    c.train.seed = seed
    c.output.dir = f"{OUT}/train/{variant}_s{seed}"
    c.output.checkpoint_every = 4
    c.output.keep = 1
    c.output.save_rollouts = True
    c.output.export_adapters = False  # full-parameter runs: the orbax checkpoint is the model
    c.eval.n = 0  # the sample stage is the evaluation
    # H_Tool / H_Reas decode two models batch-synchronously (the continuous engine serves one model); all six
    # variants sample, and train, with the same engine so that their draws share (seed, row, position) keys
    c.rollout.engine = "batch"
    # M_Unified's training is the method comparison's full fine-tuning (configs/methods_lab_compare.py: the same
    # run configuration, checked when adopted): its finished runs are linked, not trained again
    adopt = {"unified": methods_lab_compare.OUT + "/train/full_s{seed}"}
    c.cea = ConfigDict(dict(out=OUT, roles="paper", role_masks=role_masks("paper"), datasets=["lab_world1"],
                            adopt=adopt, train_seeds=SEEDS, limit=32, n_samples=24, temperature=1.0, batch=32, seed=0,
                            screen=dict(limit=96, max_limit=288, n_samples=8, seed=1, lo=1 / 8, hi=7 / 8),
                            n_boot=10_000, boot_seed=0, estimator="jeffreys",
                            title="CEA in the lab (SmolLM2-135M + lab warm start, world 1 held out)"))
    return c


