"""CEA (the paper's Capability Effect Attribution) on the embedded default: the first small-scale
finding, on 2 CPU cores.

    python -m launch.cea --config=configs/cea_quickstart.py          # every missing stage, resumable
    python -m launch.train --config=configs/cea_quickstart.py:tool   # one variant's training alone

SmolLM2-135M-Instruct with the shipped NQ warm start merged into its weights is M_Base. M_Reas,
M_Tool and M_Unified are full-parameter GRPO runs from it with the same data (the quickstart's NQ
prompts, evaluation questions removed), steps, seed and hyper-parameters; only the role mask differs
(`paper` roles: tool = the tokens inside `<search> … </search>`, reasoning = every other generated
token). The six variants (M_Base, M_Reas, M_Tool, M_Unified, H_Tool, H_Reas) are then sampled at
T = 1, 8 times each, on 64 held-out NQ questions whose gold passage is in the shipped corpus
(`nq_corpus_heldout`: nq_oracle rows neither the warm start nor any GRPO step sees), and β is solved
per question (dart_jax/analysis/cea.py).

Setting (which, and why): NQ, one search. On NQ the warm start writes the question
itself as the query, so M_Tool has little to learn and β's tool terms are expected small. HotpotQA
with two searches would give the tool role more to learn, but the warm start was trained on
one-search NQ demonstrations only and never issues a second, bridging query, and 12 GRPO steps of a
135M model are not expected to teach one; on NQ the quickstart's reward does move within this
budget. `:hotpotqa` selects the other setting (HotpotQA questions whose paragraphs are in the
corpus: the first 64 held out, the rest minus the shipped evaluation questions for training, up to two searches)
for a machine with the time.

CPU-sized choices: 12 GRPO steps of 4 prompts × 4 samples per variant (~100 s a step on 2 cores
with full-parameter updates; the quickstart's LoRA reward moves from 0.09 to 0.28 over 24 such
steps); full-parameter lr 2e-5 = the quickstart's LoRA lr (2e-4) scaled by the paper's full / LoRA
lr ratio (1e-6 / 1e-5); no KL term; old log-probs from the sampler; n = 8 samples per question
(the paper: 50), batches of 64 trajectories.
"""

from ml_collections import ConfigDict

from configs import base
from configs.cea import ROLE_MASK, role_masks
from configs.sft_quickstart import RL_ROWS, nq_oracle, shared
from dart_jax.eval.datasets import exclusion_specs

WARM_START = "data/warm_start/smollm2-135m-nq"
HOTPOT = dict(reader="flashrag", path="data/qa/hotpotqa_sample300.jsonl", data_source="hotpotqa")
HOTPOT_HELDOUT = 64  # the first 64 of hotpotqa_sample300 (eval set hotpotqa_corpus) are held out


def get_config(arg: str | None = None):
    """arg: "" | VARIANT (reas | tool | unified: that variant's training config for launch.train) |
    hotpotqa | hotpotqa,VARIANT."""
    parts = [p.strip() for p in (arg or "").split(",") if p.strip()]
    setting = "hotpotqa" if parts and parts[0] == "hotpotqa" else "nq"
    parts = parts[1:] if setting == "hotpotqa" else parts
    variant = parts[0] if parts else "unified"
    if len(parts) > 1 or variant not in ROLE_MASK["paper"]:
        raise ValueError(f"configs/cea_quickstart.py:{arg}: expected [hotpotqa,][reas|tool|unified]")
    c = shared(base.get())
    c.warm_start = WARM_START
    c.method.variant = "full"
    c.method.role_mask = ROLE_MASK["paper"][variant]
    if setting == "nq":
        c.data.train = [nq_oracle(0, RL_ROWS)]
        sample_sets = ["nq_corpus_heldout"]
    else:
        c.data.train = [dict(HOTPOT, exclude=[dict(HOTPOT, limit=HOTPOT_HELDOUT), *exclusion_specs("qa")])]
        c.rollout.max_turns = 3  # two searches, then the answer
        sample_sets = ["hotpotqa_corpus"]
    c.train.steps = 12
    c.train.prompts_per_step = 4
    c.train.group_size = 4
    c.train.mini_batch = 16
    c.train.micro_batch = 4
    c.train.pad_multiple = 64
    c.train.old_logp = "sampler"
    c.loss.kl_coef = 0.0
    c.optim.lr = 2e-5
    c.optim.warmup_steps = 0
    c.optim.total_steps = c.train.steps
    c.eval.n = 0  # the sample stage is the evaluation
    out = "runs/cea_quickstart" + ("" if setting == "nq" else "_hotpotqa")
    c.output.dir = f"{out}/train/{variant}"
    c.output.checkpoint_every = 4
    c.output.keep = 1
    c.output.save_rollouts = True
    c.output.export_adapters = False  # full-parameter runs: the orbax checkpoint is the model
    c.cea = ConfigDict(dict(out=out, roles="paper", role_masks=role_masks("paper"), datasets=sample_sets,
                            limit=64, n_samples=8, temperature=1.0, batch=64, seed=0,
                            n_boot=10_000, boot_seed=0, estimator="clip",
                            title="CEA on SmolLM2-135M + warm start (CPU quickstart)"))
    return c
