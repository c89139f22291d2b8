"""The paper's QA setups (its Experimental Setup and main QA table): DART, Search-R1 (full-parameter GRPO) and LoRA-16.

    python -m launch.prepare_data qa --input=/data/nq_hotpotqa_train/train.parquet --out=data/nq_hotpotqa_train
    python -m launch.train --config=configs/paper_qa.py:dart,qwen2.5-3b-base \
        --config.retriever.url=http://127.0.0.1:8000/retrieve

method: dart | search_r1 | lora16 | mixlora | 2agent | 2agent_lora
model:  qwen2.5-3b-base | qwen2.5-3b-instruct | qwen2.5-7b-base | qwen2.5-7b-instruct |
        llama3.1-8b-instruct | qwen3-14b-base

Hyper-parameters: 100 steps, 256 prompts × 16 samples per step, mini-batch 64 prompts (1024
trajectories), temperature 1, top-p 1, lr 1e-6 (full) / 1e-5 (LoRA, DART), warmup 10% (verl: the
first update has lr 0), KL 0.001 (k3), clip 0.2, dual clip 3, entropy 0, token-mean, action budget 4,
top-3 passages, rank 8 per DART adapter with alpha 16 (scale 2), LoRA-16 with alpha 32 (same scale),
MixLoRA at DART's budget (attention LoRAs of rank 8, 2 FFN experts of rank 8, top-2, router aux 0.001),
2-Agent as two full-parameter models (lr 1e-6 as Search-R1; DART's rollout settings: the paper's
ablation compares it with DART), 2-Agent-LoRA as two rank-8 LoRAs over the frozen base (lr 1e-5),
checkpoint every 20 steps. Observations capped at 1024 tokens (DART) / 500 (Search-R1); invalid
actions end the row (DART) / get Search-R1's corrective message. Retrieval: a Search-R1 server
(E5-base-v2 over wiki-18) at `retriever.url`; serve one with `python -m launch.serve_retriever`.
Models are Hugging Face hub ids read from the local Hugging Face cache (`hf download Qwen/Qwen2.5-3B`
before the run; nothing downloads during it); `--config.model.path=/models/Qwen2.5-3B`, a local
directory, works as well.
"""

from configs import base

MODELS = {
    "qwen2.5-3b-base": "Qwen/Qwen2.5-3B",
    "qwen2.5-3b-instruct": "Qwen/Qwen2.5-3B-Instruct",
    "qwen2.5-7b-base": "Qwen/Qwen2.5-7B",
    "qwen2.5-7b-instruct": "Qwen/Qwen2.5-7B-Instruct",
    "llama3.1-8b-instruct": "meta-llama/Llama-3.1-8B-Instruct",
    "qwen3-14b-base": "Qwen/Qwen3-14B-Base",
}
METHODS = ("dart", "search_r1", "lora16", "mixlora", "2agent", "2agent_lora")


def parse(arg: str | None, default: str) -> tuple[str, str]:
    method, _, model = (arg or default).partition(",")
    return method.strip(), model.strip()


def qa_common(c, model: str):
    if model not in MODELS:
        raise ValueError(f"model {model!r}; expected one of {sorted(MODELS)}")
    c.model.path = MODELS[model]
    c.task = "qa"
    c.data.train = [dict(spec, prepare="qa") for spec in base.search_r1_data("data/nq_hotpotqa_train/train.parquet")]
    c.retriever.url = "http://127.0.0.1:8000/retrieve"
    c.retriever.topk = 3
    c.rollout.max_turns = 4
    c.rollout.max_tokens_per_turn = 500
    c.rollout.max_response_tokens = 4096
    c.train.steps = 100
    c.train.prompts_per_step = 256
    c.train.group_size = 16
    c.train.mini_batch = 64 * 16
    c.train.micro_batch = 8
    c.optim.total_steps = 100
    c.optim.warmup_steps = 10
    c.output.checkpoint_every = 20
    c.output.keep = 5
    return c


def apply_method(c, method: str):
    if method not in METHODS:
        raise ValueError(f"method {method!r}; expected one of {METHODS}")
    if method == "dart":
        c.method.variant, c.method.rank, c.method.alpha = "dart", 8, 16.0
        c.optim.lr = 1e-5
        c.rollout.max_obs_tokens, c.rollout.invalid_action = 1024, "none"
    elif method == "mixlora":
        c.method.variant, c.method.rank, c.method.alpha = "mixlora", 8, 16.0
        c.method.experts, c.method.top_k, c.method.router_aux_coef = 2, 2, 0.001
        c.optim.lr = 1e-5
        c.rollout.max_obs_tokens, c.rollout.invalid_action = 1024, "none"
    elif method == "2agent_lora":
        c.method.variant, c.method.agent_params, c.method.rank, c.method.alpha = "2agent", "lora", 8, 16.0
        c.optim.lr = 1e-5
        c.rollout.max_obs_tokens, c.rollout.invalid_action = 1024, "none"
    elif method == "2agent":
        c.method.variant = "2agent"
        c.optim.lr = 1e-6
        c.rollout.max_obs_tokens, c.rollout.invalid_action = 1024, "none"
    elif method == "lora16":
        c.method.variant, c.method.rank, c.method.alpha = "lora", 16, 32.0
        c.optim.lr = 1e-5
        c.rollout.max_obs_tokens, c.rollout.invalid_action = 1024, "none"
    else:
        c.method.variant = "full"
        c.optim.lr = 1e-6
        c.rollout.max_obs_tokens, c.rollout.invalid_action = 500, "search_r1"
    return c


def get_config(arg: str | None = None):
    method, model = parse(arg, "dart,qwen2.5-3b-base")
    c = apply_method(qa_common(base.get(), model), method)
    c.output.dir = f"runs/{method}-{model}"
    return c
