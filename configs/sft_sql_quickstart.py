"""The SQL quickstart's warm start: LoRA SFT of SmolLM2-135M-Instruct on SkyRL-SQL-protocol
demonstrations built on the real Spider databases of the training side of the shipped split.

The shipped Spider data are split by database (dart_jax/data/spider_split.py, data/README.md): the
questions of 12 databases (Spider dev, Spider-Syn, Spider-Realistic and Spider-DK phrasings) train,
the questions of the other 11 are held out. The warm start takes gold-query fold 0 of the training
side, the GRPO quickstart (`configs/quickstart_sql.py`) fold 1, so no query is both demonstrated
and rewarded. Demonstrations (`sql_exploration`, dart_jax/sft/demos.py): the schema prompt,
`<think>`, a `<sql>` exploring a table the gold query reads, run by the real read-only executor,
its `<observation>`, `<think>`, `<solution>` gold query `</solution>`. The protocol check before and
after runs greedy rollouts of 32 held-out-database questions with the real SQLite
tool and scores execution match.

    python -m launch.sft --config=configs/sft_sql_quickstart.py
    cp -r runs/sft_sql_quickstart/warm_start/. data/warm_start/smollm2-135m-spider/   # what is shipped

Measured (docs/results/sql_warm_start_smollm2.md, ~42 min on 2 CPU cores): 36 steps of 4
demonstrations at lr 1e-3 lower the NLL of 16 held-back demonstrations 2.75 → 0.24; greedy on the
32 held-out-database questions, 30 end in a `<solution>` (0 before) after 1.0 SQL calls on average, 4 / 32
execution matches (Wilson 95% 0.05–0.28; 0 / 32 before). The first recipe (lr 3e-4, batch 8)
reached NLL 0.94 in 36 steps and taught no rollout the protocol.
"""

from ml_collections import ConfigDict

from configs import base
from dart_jax.data.spider_split import heldout_specs, train_specs

SFT_FOLD, RL_FOLD = 0, 1  # gold-query folds of the training databases
# demonstrations per source, each a seeded sample across the training databases
# (2 CPU cores: a 1.1k-token demonstration costs ~11 s of update, a held-out rollout ~7 s)
SFT_ROWS = {"spider_dev": 56, "spider_syn": 56, "spider_realistic": 24, "spider_dk": 24}
HELDOUT_N = 32


def heldout(n: int = 0) -> list[dict]:
    """The held-out check: n Spider dev questions sampled (seed 0) across the held-out databases."""
    return [dict(spec, shuffle=0, limit=n or HELDOUT_N) for spec in heldout_specs(("spider_dev",))]


def shared(c: ConfigDict) -> ConfigDict:
    """Model, tool and rollout fields the SQL warm start and the SQL GRPO quickstart must agree on."""
    c.task = "sql"
    c.model.path = "smollm2-135m-instruct"
    c.model.param_dtype = "float32"
    c.model.compute_dtype = "float32"
    c.model.remat_policy = "none"
    c.rollout.max_turns = 3
    c.rollout.max_tokens_per_turn = 128
    c.rollout.max_obs_tokens = 256
    c.rollout.max_response_tokens = 768
    c.rollout.invalid_action = "none"
    c.tool.sql_timeout_s = 5.0
    c.mesh.shape = (1, 1, 1)
    return c


def get_config():
    c = shared(base.get())
    c.method.variant = "lora"
    c.method.rank = 8
    c.method.alpha = 16.0
    data = []
    for k, spec in enumerate(train_specs(SFT_FOLD)):
        src = spec["data_source"].rsplit("_", 1)[0]
        data.append(dict(spec, builder="sql_exploration", shuffle=k, limit=SFT_ROWS[src]))
    c.sft = ConfigDict(dict(
        data=data, exclude=heldout_specs(("spider_dev", "spider_syn", "spider_realistic", "spider_dk")),
        check_data=heldout(),
        # micro-batches of 2: without remat, a 1.3k-token sequence holds ~5 GB of activations;
        # batches of 4 at lr 1e-3: 36 LoRA steps in one epoch (lr 3e-4 with batches of 8 learned too slowly)
        epochs=1, batch_size=4, micro_batch=2, max_length=1344, val_size=16, eval_every=12,
        protocol_check=HELDOUT_N, sampled_check=False,  # greedy only: a 32-question check is ~4 min here
        seed=0, export_dtype="float16", train_tag_rows=True))
    c.optim.lr = 1e-3
    c.optim.warmup_steps = 3
    c.optim.schedule = "cosine"
    c.optim.min_lr_ratio = 0.1
    c.optim.total_steps = 0  # 0: the SFT length (epochs × batches)
    c.train.pad_multiple = 64
    c.output.dir = "runs/sft_sql_quickstart"
    c.output.checkpoint_every = 12
    c.output.keep = 1
    return c
