"""Defaults shared by every config: the paper's hyper-parameters (its Experimental Setup) and verl's GRPO conventions.

Each experiment file calls `base.get()` and overrides what differs. `base.get()` is built from the
dataclasses of dart_jax/run/spec.py, the only home of the defaults: each section maps one to one
onto a dataclass, each key onto a field (tests/test_configs.py checks it), and `run_spec(config)`
parses the sections back into them:

    task            qa (Search-R1) | sql (SkyRL-SQL)
    init_from       what to start from: DART adapters (or a run holding them), PEFT / HF / authors' dirs
    warm_start      a LoRA warm-start directory (launch.sft) merged into the base
    model           ModelSettings: path, dtypes, remat, scan; cache_block: attention over a KV cache reads
                    its written blocks of 128 slots (0: all)
    method          MethodSpec: variant, rank, alpha, targets, ...; experts / top_k / router_aux_coef for
                    MixLoRA only; agent_params for 2-Agent: "full" models | "lora" (one LoRA each)
    router          ψ's convention; algo: GRPO's norm_adv_by_std
    loss            LossConfig; norm_length: seq-mean-token-sum-norm's L, 0 = rollout.max_response_tokens
    optim           OptimConfig; schedule_clock "rl_step": verl's lr moves once per RL step
    sampling        SamplingConfig
    rollout         RolloutConfig: the turn budget (4 turns of 500 tokens, 4,096 response tokens, 1,024
                    observation tokens) and DART's invalid-action rule ("none": the row ends); the prompt's
                    instruction tags ("atomic" or "text"); the decode loop's weights (decode_layout:
                    "per_layer", a sharded per-layer copy, fastest on XLA:CPU; "stacked", slices of the
                    training tree; "shared", a frozen base held per layer for training and rollouts alike,
                    no copy: rollout.placement); chunk_rows: trajectories decoded at once, whole GRPO groups
                    (a multiple of train.group_size): the KV cache holds this many rows, not the step's
                    share; 0 = the share in one batch. Same trajectories either way. engine: evaluation's
                    rollouts (launch.evaluate, held-out checks) and train_engine: GRPO's, each "batch"
                    (lockstep turns) or "continuous" (the serving engine: no row waits for another's turn,
                    a finished row costs nothing or is refilled; same draws per row; one process, one
                    device, one model; engine_segment tokens per decode segment); gather_rows: a batch of
                    at least this many rows decodes and appends only its running rows once they fit a
                    smaller bucket (1, 2, 4, …; one device; a raised vm.max_map_count on XLA:CPU; 0 =
                    never): the same draws per row; obs_multiple: an observation append's columns, the
                    power-of-two bucket of its longest observation (0) or that length rounded up to a
                    multiple of obs_multiple (more compiled widths, less padded prefill)
    retriever       the <search> tool: a Search-R1 retrieval server at `url`, else the index directory
                    `index_dir` (launch.build_index), else an index of `corpus` by `encoder` built on first
                    use. Prefixes "" take the index's meta.json (detected from the encoder: "query: " /
                    "passage: " for E5). kind: "dense" (faiss) | "lexical" (SQLite FTS5 BM25)
    tool            the SQL tool's timeout
    reward          training reward (dart_jax/rewards/training.py): QA em | em_format (Search-R1's partial
                    format credit); SQL shaping paper (+1 / −1) | skyrl (+1 / 0 wrong / −1 format), empty
                    gold results earn nothing unless reward_empty_gold, 30 s per reward query; sql_match
                    set (SkyRL's frozenset comparison of result rows) | spider (Spider EX's: multisets,
                    columns permutable, row order counts when the gold query has ORDER BY)
    data            train: the training datasets (configs add them)
    train           TrainSettings: the GRPO batch (256 prompts × 16 samples, mini-batches of 1,024);
                    micro_batch_padding "mini_batch" (one program scans a mini-batch's micro-batches,
                    all padded to its longest row) | "own" (each padded to its own, one call each)
    eval            held-out rollouts during training (batch: rows together; 0 = max(train.micro_batch, 8))
    mesh            shape () = every device on the data axis
    output          the run directory and what it writes
"""

from ml_collections import ConfigDict

from dart_jax.run.spec import defaults


def get() -> ConfigDict:
    return ConfigDict(defaults())


def search_r1_data(train_parquet: str = "") -> list:
    """Search-R1's merged NQ + HotpotQA train parquet (the user supplies the path), with every question
    of the shipped QA evaluation sets excluded."""
    from dart_jax.eval.datasets import exclusion_specs
    return [dict(reader="search_r1_parquet", path=train_parquet, data_source="", exclude=exclusion_specs("qa"))]
