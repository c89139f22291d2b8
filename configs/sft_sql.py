"""LoRA warm start for the NL2SQL protocol (SkyRL-SQL tags) on Spider *train*.

    python -m launch.sft --config=configs/sft_sql.py \
        --config.sft.data[0].path=/data/spider/train_spider.json --config.sft.data[0].db_root=/data/spider/database
    python -m launch.train --config=configs/paper_sql.py:dart --config.warm_start=runs/sft_sql/warm_start ...

Demonstrations (dart_jax/sft/demos.py `sql_demos`): the schema prompt, a `<sql>` exploring a table
the gold query reads, run by the real read-only executor, its `<observation>`, then
`<solution>` with the gold query (only gold queries that execute are kept). Or distil the correct
trajectories of an earlier run: `--config.sft.data='[{"builder": "distill", "path": "runs/x/rollouts.jsonl"}]'`.

Spider train is not shipped (only dev, our evaluation set): every question of every shipped SQL
evaluation set is excluded (`sft.exclude`), so pointing `sft.data` at the dev set yields no
demonstrations rather than a leak.
"""

from ml_collections import ConfigDict

from configs import base
from dart_jax.eval.datasets import exclusion_specs


def get_config():
    c = base.get()
    c.task = "sql"
    c.model.path = "Qwen/Qwen2.5-Coder-7B-Instruct"
    c.method.variant = "lora"
    c.method.rank = 16
    c.method.alpha = 32.0
    c.rollout.max_turns = 5
    c.rollout.max_obs_tokens = 1024
    c.sft = ConfigDict(dict(
        data=[dict(builder="sql_exploration", reader="spider", path="data/spider/train_spider.json",
                   db_root="data/spider/database", data_source="spider_train")],
        exclude=exclusion_specs("sql"),
        epochs=2, batch_size=64, micro_batch=4, max_length=4096, val_size=64, eval_every=50,
        protocol_check=64, seed=0, export_dtype="float32", train_tag_rows=True))
    c.optim.lr = 1e-4
    c.optim.warmup_steps = 10
    c.optim.schedule = "cosine"
    c.optim.total_steps = 0
    c.output.dir = "runs/sft_sql"
    c.output.checkpoint_every = 100
    return c
