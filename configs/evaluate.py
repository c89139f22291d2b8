"""Evaluation defaults for `launch.evaluate` without --config: the paper's rollout settings per task.
With --checkpoint=RUN the run's own settings (base model, tool, rollout; its run_config.json and
dart_adapters.json) replace these: a run is evaluated as it was trained (dart_jax/eval/as_trained.py).

    python -m launch.evaluate --model smollm2-135m-instruct --task sql --dataset spider_dev --limit 50
    python -m launch.evaluate --config=configs/evaluate.py:qa --config.model.path=DIR ...

qa: Search-R1 protocol, 4 tool turns, 500 tokens per turn, top-3 passages (1,024-token observation)
    from the shipped MiniLM index over the shipped Wikipedia sample (set retriever.url to a wiki-18
    server for the paper's corpus).
    The lab's sets (--dataset=lab_world1,lab_world1_easy,lab_world0) are searched over their own world's
    corpus by retriever.kind: the lab measures with --config.retriever.kind=lexical (a lab run's own).
sql: SkyRL-SQL protocol, 5 turns, 1,024 tokens per turn, 5 s tool timeout.
fp32 weights and compute (exact on CPU; on accelerators --config.model.compute_dtype=bfloat16).
"""

from configs import base


def get_config(arg: str | None = None):
    task = (arg or "qa").strip()
    if task not in ("qa", "sql"):
        raise ValueError(f"configs/evaluate.py:{task}: expected qa or sql")
    c = base.get()
    c.task = task
    c.model.path = "smollm2-135m-instruct"
    c.model.param_dtype = "float32"
    c.model.compute_dtype = "float32"
    c.model.remat_policy = "none"
    c.method.variant = "full"  # no adapters unless --checkpoint / --peft bring them
    c.rollout.invalid_action = "none"
    if task == "qa":
        c.retriever.topk = 3
        c.rollout.max_turns = 4
        c.rollout.max_tokens_per_turn = 500
        c.rollout.max_response_tokens = 4096
        c.rollout.max_obs_tokens = 1024
    else:
        c.rollout.max_turns = 5
        c.rollout.max_tokens_per_turn = 1024
        c.rollout.max_response_tokens = 6144
        c.rollout.max_obs_tokens = 1024
        c.tool.sql_timeout_s = 5.0
    c.mesh.shape = (1, 1, 1)
    c.output.dir = "runs/eval"
    return c
