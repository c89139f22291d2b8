"""The quickstart's warm start: LoRA SFT of SmolLM2-135M-Instruct on Search-R1-protocol demonstrations.

Demonstrations come from real NQ questions (the shipped nq_oracle slice, minus every question of
the NQ evaluation slice and minus the questions the quickstart's GRPO run trains on) with the real
MiniLM retriever: `<think>`, `<search> question </search>`, the retriever's actual passages as
`<information>`, `<think>` naming the passage, `<answer> gold </answer>` (dart_jax/sft/demos.py).
The result is merged into the base by `configs/quickstart.py` (`warm_start`), as in the DART
authors' pipeline. This reproduces the shipped `data/warm_start/smollm2-135m-nq`:

    python -m launch.sft --config=configs/sft_quickstart.py
    # then copy runs/sft_quickstart/warm_start to data/warm_start/smollm2-135m-nq
"""

from ml_collections import ConfigDict

from configs import base

NQ_EVAL = dict(reader="flashrag", path="data/qa/nq_test_sample1000.jsonl", data_source="nq")
RL_ROWS = 1024  # the first RL_ROWS eligible nq_oracle questions are the quickstart's GRPO prompts
SFT_ROWS = 640  # the next SFT_ROWS build the warm-start demonstrations
EVAL_OFFSET = RL_ROWS + SFT_ROWS  # then the quickstart's held-out progress questions (eval.data)


def nq_oracle(offset: int, limit: int) -> dict:
    """nq_oracle questions with the evaluation slice removed, then [offset, offset + limit)."""
    return dict(reader="flashrag", path="data/qa/nq_oracle.jsonl", data_source="nq", offset=offset, limit=limit,
                exclude=[NQ_EVAL])


def shared(c: ConfigDict) -> ConfigDict:
    """Model, tool and rollout fields the warm start and the GRPO quickstart must agree on."""
    c.model.path = "smollm2-135m-instruct"
    c.model.param_dtype = "float32"
    c.model.compute_dtype = "float32"
    c.model.remat_policy = "none"
    c.retriever.topk = 1
    c.rollout.max_turns = 2
    c.rollout.max_tokens_per_turn = 64
    c.rollout.max_obs_tokens = 192
    c.rollout.max_response_tokens = 512
    c.rollout.invalid_action = "none"
    c.mesh.shape = (1, 1, 1)
    return c


def get_config():
    c = shared(base.get())
    c.method.variant = "lora"
    c.method.rank = 8
    c.method.alpha = 16.0
    c.sft = ConfigDict(dict(
        data=[dict(builder="qa_retrieval", **nq_oracle(RL_ROWS, SFT_ROWS))],
        exclude=[NQ_EVAL],
        epochs=1, batch_size=8, micro_batch=4, max_length=640, val_size=32, eval_every=20,
        protocol_check=32, seed=0, export_dtype="float16", train_tag_rows=True))
    c.optim.lr = 3e-4
    c.optim.warmup_steps = 5
    c.optim.schedule = "cosine"
    c.optim.min_lr_ratio = 0.1
    c.optim.total_steps = 0  # 0: the SFT length (epochs × batches)
    c.train.pad_multiple = 64
    c.output.dir = "runs/sft_quickstart"
    c.output.checkpoint_every = 25
    c.output.keep = 1
    return c
