"""The lab's quickstart: DART GRPO from the lab warm start on multi-hop questions of lab world 0,
checked on the held-out world 1. CPU-sized; nothing to download.

SmolLM2-135M-Instruct with `data/warm_start/smollm2-135m-lab` merged into its weights (LoRA SFT on
demonstrations of the low end of both dials: `configs/sft_lab_quickstart.py`), then fresh reasoning /
tool adapters trained by GRPO at the RL difficulty — two and three hops, every operation — with the
lexical retriever over world 0's corpus (top-1 passage). The held-out check (greedy, before the first
and after the last step) asks world 1's questions of the same difficulty over world 1's corpus
(`eval.corpus`): invented entities the training world never named. Role skills are logged beside the
reward every step (`lab/tool_skill`, `lab/reasoning_skill`, `lab/copy_rate`, ...; dart_jax/lab/metrics.py).

    python -m launch.train --config=configs/lab_quickstart.py

Measured (docs/results/lab.md, three seeds through configs/methods_lab.py): eight steps take 40-46 min
on 2 cores (not the 25 the lab asked for); held-out accuracy fell on every seed (7/48 -> 3, 3, 2) and no
role skill moved beyond the seed spread: only 2-5 of a run's 32 groups had mixed rewards at T = 1.

Afterwards, per cell: `python -m launch.evaluate --checkpoint=runs/lab_quickstart --dataset=lab_world1`.
"""

from configs import quickstart
from configs.sft_lab_quickstart import RL_HOPS, WORLD0, WORLD1, lab_questions, shared

WARM_START = "data/warm_start/smollm2-135m-lab"
EVAL_N = 16
# LoRA's rate for 8 steps: the warm start's SFT rate. At the embedded default's 2e-4 an adapter moves ~1e-3
# per entry in 8 Adam steps, and the NQ method comparison saw no method move in 24 steps at 2e-4
LR = 1e-3


def get_config():
    # the embedded default's CPU-sized GRPO (4 prompts × 4 samples, sampler log-probs, no KL, lr 2e-4) with
    # the lab's model, tool and rollout fields
    c = shared(quickstart.get_config())
    c.warm_start = WARM_START
    # a three-hop comparison or difference looks up 6 passages (two chains of three). Six calls: no spare
    # for a reformulation at h = 3, and no 7-10-call stragglers holding a rollout batch (the warm start
    # made 7-10 calls on 14 of 96 held-out questions under a budget of 10, and answered 2 of them)
    c.rollout.max_turns = 6
    c.optim.lr = LR
    # each row runs its own prompt in the update, as the lab's studies were run (the comparison includes MixLoRA
    # and 2-Agent, which cannot share one; run.spec): the embedded default's shared prompt is not inherited
    c.train.share_prefix = False
    c.train.micro_batch_padding = "mini_batch"  # as the lab's studies were run: not the embedded default's "own"
    c.eval.batch = 0  # held-out batches of max(train.micro_batch, 8) rows, as the lab's studies were run
    # evaluations (launch.evaluate, the methods study's) on the serving engine: a finished row refilled at once,
    # same draws as the batch loop; 1.26x its speed on 16 held-out questions. GRPO's rollouts stay batch
    # (rollout.train_engine): 1.2-1.4x on the engine, but its compiled programs' memory beside training's is
    # untested on a 24 GiB host (docs/serving.md)
    c.rollout.engine = "continuous"
    c.data.train = [lab_questions(WORLD0, RL_HOPS, shuffle=0)]
    c.train.steps = 8
    c.optim.total_steps = c.train.steps
    # held-out world: questions of the training difficulty over entities no training step saw
    c.eval.data = [lab_questions(WORLD1, RL_HOPS, shuffle=0)]
    c.eval.corpus = f"{WORLD1}/corpus.jsonl"
    c.eval.n = EVAL_N
    c.output.dir = "runs/lab_quickstart"
    # recompute attention in the backward pass, keep the weight matmuls' outputs (as configs/quickstart_sql.py):
    # without it an update held ~20 GB resident on 4×4×1,216-token micro-batches (the scores are O(T²) per layer)
    c.model.remat_policy = "dots_no_batch"
    # a step is ~5 min on 2 cores: a checkpoint every step (adapters and Adam moments, a few MB)
    c.output.checkpoint_every = 1
    return c
