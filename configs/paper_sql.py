"""The paper's NL2SQL setups (its NL2SQL setting and results) on Qwen2.5-Coder-7B(-Instruct), SkyRL-SQL protocol.

    python -m launch.prepare_data sql --input=/data/skyrl_sql_653/train.parquet --db-root=/data/omnisql/data \
        --out=data/skyrl_sql
    python -m launch.train --config=configs/paper_sql.py:dart

method: dart | lora | full (Sky-SQL's full-parameter GRPO) | mixlora (DART's budget: rank-8 attention
LoRAs, 2 FFN experts of rank 8, top-2, router aux 0.001)

Model: the hub id Qwen/Qwen2.5-Coder-7B-Instruct, read from the local Hugging Face cache (`hf download
Qwen/Qwen2.5-Coder-7B-Instruct` before the run; nothing downloads during it);
`--config.model.path=DIR` takes a local directory instead.

Training data: data/skyrl_sql/train.parquet, SkyRL-SQL-653 as launch.prepare_data sql writes it (its
rows carry their database path; a missing file names the command). A published newfmt or
verl-format parquet works too with `--config.data.train[0].path=FILE --config.data.train[0].db_root=DIR`,
DIR being SkyRL's `db_path` (OmniSQL's data/ folder, holding SynSQL-2.5M/databases, spider/database
and bird/train/train_databases). Every shipped evaluation set (Spider dev / DK / Realistic / Syn,
BIRD dev / mini-dev) is excluded from it by question.
Reward +1 / −1 (SkyRL's format check, then execution match with result rows compared as sets;
`--config.reward.sql_shaping=skyrl` for SkyRL's +1 / 0 / −1), empty gold results earn nothing, a failing gold
query drops its prompt; max 5 turns, observation tables truncated to 50 rows, 5 s tool timeout, 30 s reward
timeout.
"""

from configs import base
from dart_jax.eval.datasets import exclusion_specs

METHODS = ("dart", "lora", "full", "mixlora")


def get_config(arg: str | None = None):
    method = (arg or "dart").strip()
    if method not in METHODS:
        raise ValueError(f"method {method!r}; expected one of {METHODS}")
    c = base.get()
    c.task = "sql"
    c.model.path = "Qwen/Qwen2.5-Coder-7B-Instruct"
    c.data.train = [dict(reader="skyrl_sql", path="data/skyrl_sql/train.parquet", db_root="", data_source="skyrl_sql",
                         prepare="sql", exclude=exclusion_specs("sql"))]
    c.reward.sql_match = "set"  # SkyRL-SQL's frozenset comparison of result rows, as published
    c.rollout.max_turns = 5
    c.rollout.max_tokens_per_turn = 1024
    c.rollout.max_response_tokens = 6144
    c.rollout.max_obs_tokens = 1024
    c.rollout.invalid_action = "none"
    c.tool.sql_timeout_s = 5.0
    c.train.steps = 100
    c.train.prompts_per_step = 256
    c.train.group_size = 5
    c.train.mini_batch = 256 * 5 // 4
    c.train.micro_batch = 4
    c.optim.total_steps = 100
    c.optim.warmup_steps = 10
    c.output.checkpoint_every = 20
    if method == "dart":
        c.method.variant, c.method.rank, c.method.alpha, c.optim.lr = "dart", 8, 16.0, 1e-5
    elif method == "lora":
        c.method.variant, c.method.rank, c.method.alpha, c.optim.lr = "lora", 16, 32.0, 1e-5
    elif method == "mixlora":
        c.method.variant, c.method.rank, c.method.alpha, c.optim.lr = "mixlora", 8, 16.0, 1e-5
        c.method.experts, c.method.top_k, c.method.router_aux_coef = 2, 2, 0.001
    else:
        c.method.variant, c.optim.lr = "full", 1e-6
    c.output.dir = f"runs/sql-{method}-qwen2.5-coder-7b"
    return c
