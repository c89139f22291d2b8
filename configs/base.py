"""Defaults shared by every config: the paper's hyper-parameters (its Experimental Setup) and verl's GRPO conventions.

Each experiment file calls `base.get()` and overrides what differs. Field groups map one-to-one on
dataclasses: method -> MethodSpec, loss -> LossConfig, optim -> OptimConfig, rollout ->
RolloutConfig, sampling -> SamplingConfig.
"""

from ml_collections import ConfigDict


def get() -> ConfigDict:
    c = ConfigDict()
    c.task = "qa"                       # qa (Search-R1) | sql (SkyRL-SQL)
    c.init_from = ""                    # a DART adapter directory to start from
    c.warm_start = ""                   # a LoRA warm-start directory (launch.sft) merged into the base
    c.model = ConfigDict(dict(path="", param_dtype="bfloat16", compute_dtype="bfloat16",
                              remat_policy="dots", scan_layers=True,
                              cache_block=128))  # attention over a KV cache reads its written blocks of 128 slots (0: all)
    c.method = ConfigDict(dict(variant="dart", rank=8, alpha=16.0,
                               targets=("q", "k", "v", "o", "gate", "up", "down"), init="normal",
                               init_std=0.02, rslora=False, dropout=0.0, isolation="forward",
                               role_mask="both", adapter_dtype="float32",
                               experts=2, top_k=2, router_aux_coef=0.001,  # experts..: MixLoRA only
                               agent_params="full"))  # 2-Agent: "full" models | "lora" (one LoRA each)
    c.router = ConfigDict(dict(convention="dart_jax"))
    c.algo = ConfigDict(dict(norm_adv_by_std=True))
    c.loss = ConfigDict(dict(temperature=1.0, clip_low=0.2, clip_high=0.2, dual_clip=3.0, kl_coef=0.001,
                             kl_type="k3", kl_clamp=True, entropy_coef=0.0, agg_mode="token-mean",
                             micro_mode="global", logprob_chunk=128,
                             norm_length=0))  # seq-mean-token-sum-norm's L; 0 = rollout.max_response_tokens
    c.optim = ConfigDict(dict(lr=1e-5, warmup_steps=10, total_steps=100, schedule="constant", min_lr_ratio=0.0,
                              weight_decay=0.01, b1=0.9, b2=0.999, eps=1e-8, clip_norm=1.0,
                              schedule_clock="rl_step"))  # verl: the lr moves once per RL step
    c.sampling = ConfigDict(dict(temperature=1.0, top_p=1.0, top_k=0))
    c.rollout = ConfigDict(dict(max_turns=4, max_tokens_per_turn=500, max_response_tokens=4096,
                                max_obs_tokens=1024, invalid_action="none", final_answer_segment=True,
                                prompt_tags="atomic",  # the prompt's instruction tags: "atomic" or "text"
                                # the decode loop's weights: "per_layer" (a sharded per-layer copy, fastest
                                # on XLA:CPU), "stacked" (slices of the training tree) or "shared" (a frozen
                                # base held per layer for training and rollouts alike: no copy);
                                # rollout.placement
                                decode_layout="per_layer",
                                # trajectories decoded at once, whole GRPO groups (a multiple of
                                # train.group_size): the KV cache holds this many rows, not the step's
                                # share; 0 = the share in one batch. Same trajectories either way
                                chunk_rows=0))
    # the <search> tool: a Search-R1 retrieval server at `url`, else the index directory `index_dir`
    # (launch.build_index), else an index of `corpus` by `encoder` built on first use. Prefixes ""
    # take the index's meta.json (detected from the encoder: "query: " / "passage: " for E5)
    c.retriever = ConfigDict(dict(url="", index_dir="", corpus="data/corpus/wiki_sample.jsonl",
                                  encoder="all-minilm-l6-v2", topk=3, query_prefix="", passage_prefix=""))
    c.tool = ConfigDict(dict(sql_timeout_s=5.0))
    # training reward (dart_jax/rewards/training.py): QA em | em_format (Search-R1's partial format
    # credit); SQL shaping paper (+1 / −1) | skyrl (+1 / 0 wrong / −1 format), empty gold results earn
    # nothing unless reward_empty_gold, 30 s per reward query; sql_match set (SkyRL's frozenset comparison
    # of result rows) | spider (Spider EX's: multisets, columns permutable, row order counts when the
    # gold query has ORDER BY)
    c.reward = ConfigDict(dict(qa="em", structure_format_score=0.2, final_format_score=0.1, retrieval_score=0.1,
                               sql_shaping="paper", reward_empty_gold=False, sql_match="set", sql_timeout_s=30.0,
                               workers=8))
    c.data = ConfigDict(dict(train=[]))
    c.train = ConfigDict(dict(steps=100, prompts_per_step=256, group_size=16, mini_batch=1024, micro_batch=8,
                              ppo_epochs=1, seed=0, shuffle=True, shuffle_minibatches=True, pad_multiple=128,
                                old_logp="recompute", release_host_memory=True, share_prefix=False))
    c.eval = ConfigDict(dict(data=[], n=0, every=0, temperature=0.0))  # held-out rollouts during training
    c.mesh = ConfigDict(dict(shape=()))  # () = every device on the data axis
    c.output = ConfigDict(dict(dir="runs/default", checkpoint_every=20, keep=3, tensorboard=True, progress=True,
                               export_adapters=True, save_rollouts=False))
    return c




def search_r1_data(train_parquet: str = "") -> list:
    """Search-R1's merged NQ + HotpotQA train parquet (the user supplies the path), with every question
    of the shipped QA evaluation sets excluded."""
    from dart_jax.eval.datasets import exclusion_specs
    return [dict(reader="search_r1_parquet", path=train_parquet, data_source="", exclude=exclusion_specs("qa"))]
