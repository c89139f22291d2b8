"""The run spec: a run's ml_collections config parsed once into typed, validated settings.

    config (configs/*.py, --config.x=y) ──run_spec(config, nproc)──► RunSpec
        one frozen dataclass per config section, one field per key: the dataclasses hold the ONLY
        defaults (configs/base.py is built from them, `defaults()`); an unknown key fails naming
        section.field; every rule that ties fields together is checked here, before anything loads

The sections and their dataclasses (`SECTIONS`):

    model -> ModelSettings     method -> MethodSpec       loss -> LossConfig       optim -> OptimConfig
    sampling -> SamplingConfig rollout -> RolloutConfig   reward -> RewardConfig   train -> TrainSettings
    eval -> EvalSettings       mesh -> MeshSettings       output -> OutputSettings retriever -> RetrieverSettings
    tool -> ToolSettings       router -> RouterSettings   algo -> AlgoSettings     data -> DataSettings
    sft -> SFTSettings (launch.sft's configs only; no defaults for what a warm start must choose)

Fields the run derives rather than reads (`DERIVED`): `loss.objective` (the SFT trainer sets "sft")
and `rollout.route_mode` (the method's, `MethodSpec.route_mode`). Sections other than these (a study's
own, e.g. `cea`, `grad_angles`, `methods`) are left to the code that reads them.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import Any

from dart_jax.adapters.method import MethodSpec
from dart_jax.errors import UserError
from dart_jax.rewards.training import RewardConfig
from dart_jax.rollout.agent import RolloutConfig
from dart_jax.rollout.sampling import SamplingConfig

# the values a loss / optimiser / update setting may take (rl/losses.py, rl/optim.py, rl/stages.py act on them)
KL_TYPES = ("k1", "abs", "k2", "k3")
LOGPROB_RESIDUALS = ("recompute", "logits", "autodiff")  # what the log-probs' backward starts from
AGG_MODES = ("token-mean", "seq-mean-token-sum", "seq-mean-token-mean", "seq-mean-token-sum-norm")
MICRO_MODES = ("global", "verl_microbatch_mean")
OBJECTIVES = ("grpo", "sft")
SCHEDULES = ("constant", "cosine")
CLOCKS = ("rl_step", "update")
OLD_LOGP = ("recompute", "sampler")
MICRO_BATCH_PADDING = ("mini_batch", "own")  # train.micro_batch_padding
SFT_VARIANTS = ("lora", "dart", "full")
TASKS = ("qa", "sql")
RETRIEVER_KINDS = ("dense", "lexical")  # tools/retrieval.py (faiss) | tools/lexical.py (SQLite FTS5 BM25)

# a field whose config value is a list (configs extend it: dataset entries); the spec holds a tuple
AS_LIST = {"config": list}


def at_least(section: str, settings, least, *names: str) -> None:
    """Each named field of `settings` is ≥ `least`; else a UserError naming section.field and its value
    (a count of steps, prompts or checkpoints below 1 would run nothing, or wrongly, without a word)."""
    for name in names:
        value = getattr(settings, name)
        if value is not None and not isinstance(value, bool) and isinstance(value, (int, float)) and value < least:
            raise UserError(f"{section}.{name}={value} must be ≥ {least}; set --config.{section}.{name}")


# -- the trainer's dataclasses (rl/ acts on them) -------------------------------------------------------
@dataclass(frozen=True)
class LossConfig:
    temperature: float = 1.0
    clip_low: float = 0.2
    clip_high: float = 0.2
    dual_clip: float | None = 3.0
    kl_coef: float = 0.001
    kl_type: str = "k3"
    kl_clamp: bool = True
    entropy_coef: float = 0.0
    agg_mode: str = "token-mean"
    micro_mode: str = "global"
    logprob_chunk: int = 128
    logprob_residual: str = "recompute"  # what the log-probs' backward starts from (rl/logprobs.py)
    objective: str = "grpo"  # grpo (clipped policy loss) | sft (−log p on the loss-mask tokens)
    norm_length: int = 0     # seq-mean-token-sum-norm's L; 0 in a config = rollout.max_response_tokens

    def __post_init__(self):
        for name, allowed in (("kl_type", KL_TYPES), ("agg_mode", AGG_MODES), ("micro_mode", MICRO_MODES),
                              ("objective", OBJECTIVES), ("logprob_residual", LOGPROB_RESIDUALS)):
            if getattr(self, name) not in allowed:
                raise ValueError(f"loss.{name}={getattr(self, name)!r}; expected one of {allowed}")
        if self.agg_mode == "seq-mean-token-sum-norm" and self.norm_length <= 0:
            raise ValueError("loss.agg_mode='seq-mean-token-sum-norm' divides by the maximum response length: "
                             f"loss.norm_length must be > 0, got {self.norm_length}")


@dataclass(frozen=True)
class OptimConfig:
    lr: float = 1e-5
    warmup_steps: int = 10
    total_steps: int = 100
    schedule: str = "constant"
    min_lr_ratio: float = 0.0
    weight_decay: float = 0.01
    b1: float = 0.9
    b2: float = 0.999
    eps: float = 1e-8
    clip_norm: float | None = 1.0
    schedule_clock: str = "rl_step"  # verl: the lr moves once per RL step (rl/optim.py)

    def __post_init__(self):
        if self.schedule not in SCHEDULES:
            raise ValueError(f"optim.schedule={self.schedule!r}; expected one of {SCHEDULES}")
        if self.schedule_clock not in CLOCKS:
            raise ValueError(f"optim.schedule_clock={self.schedule_clock!r}; expected one of {CLOCKS}")
        if self.lr < 0 or self.warmup_steps < 0:
            raise ValueError(f"optim.lr ({self.lr}) and optim.warmup_steps ({self.warmup_steps}) must be ≥ 0")
        at_least("optim", self, 0, "weight_decay", "min_lr_ratio", "eps")


@dataclass(frozen=True)
class UpdatePlan:
    """How one RL step's batch is split and walked (config.train)."""
    mini_batch: int
    micro_batch: int
    ppo_epochs: int = 1
    shuffle_minibatches: bool = True
    seed: int = 0
    old_logp: str = "recompute"   # recompute (verl) | sampler (the sampler's recorded log-probs)
    # run each micro-batch's common prefix once (rl/batch.split_shared_prefix): with micro_batch =
    # group_size the micro-batches are whole GRPO groups (group_order) and the prefix their prompt
    share_prefix: bool = False
    pad_multiple: int = 128  # = TrainSettings.pad_multiple
    micro_batch_padding: str = "mini_batch"  # = TrainSettings.micro_batch_padding

    def __post_init__(self):
        if self.old_logp not in OLD_LOGP:
            raise ValueError(f"train.old_logp={self.old_logp!r}; expected one of {OLD_LOGP}")
        if self.micro_batch_padding not in MICRO_BATCH_PADDING:
            raise ValueError(f"train.micro_batch_padding={self.micro_batch_padding!r}; expected one of "
                             f"{MICRO_BATCH_PADDING}")


# -- the run's other sections ---------------------------------------------------------------------------
@dataclass(frozen=True)
class ModelSettings:
    path: str = ""                  # a path, an embedded name or a hub id (models.names)
    param_dtype: str = "bfloat16"
    compute_dtype: str = "bfloat16"
    remat_policy: str = "dots"
    scan_layers: bool = True
    attention_impl: str = "xla"     # "xla" (portable, hand-written GQA) | "cudnn" | "auto" (models/attention.py)
    causal_block: int = 128         # cache-free "xla" attention: query blocks skip later keys (0: off)
    cache_block: int = 128          # attention over a KV cache reads its written blocks of 128 slots (0: all)

    def overrides(self) -> dict:
        """The ModelConfig fields this section sets: everything but the path, empty values skipped."""
        return {k: v for k, v in dataclasses.asdict(self).items() if k != "path" and v not in (None, "")}


@dataclass(frozen=True)
class TrainSettings:
    steps: int = 100
    prompts_per_step: int = 256
    group_size: int = 16
    mini_batch: int = 1024
    micro_batch: int = 8
    ppo_epochs: int = 1
    seed: int = 0
    shuffle: bool = True
    shuffle_minibatches: bool = True
    pad_multiple: int = 128
    old_logp: str = "recompute"
    release_host_memory: bool = True   # hand free pages back between stages (run.host_memory)
    share_prefix: bool = False
    # "mini_batch": one program scans a mini-batch's micro-batches, all padded to its longest row;
    # "own": each micro-batch padded to its own longest row (with share_prefix: its group's) and run
    # as its own call, gradients summed in the same order (the same update to rounding)
    micro_batch_padding: str = "mini_batch"

    def __post_init__(self):
        at_least("train", self, 1, "steps", "prompts_per_step", "group_size", "mini_batch", "micro_batch",
                 "ppo_epochs", "pad_multiple")


@dataclass(frozen=True)
class EvalSettings:
    """Held-out rollouts during training (run.held_out)."""
    data: tuple = field(default=(), metadata=AS_LIST)
    n: int = 0
    every: int = 0                  # plus the first (step 0) and the last step
    temperature: float = 0.0
    corpus: str = ""                # the held-out questions' corpus (a held-out lab world); "" = the run's tool's
    batch: int = 0                  # rows rolled out together; 0 = max(train.micro_batch, 8)

    def __post_init__(self):
        at_least("eval", self, 0, "n", "every", "temperature", "batch")


@dataclass(frozen=True)
class MeshSettings:
    shape: tuple = ()               # (data, fsdp, tensor); () = every device on the data axis

    def resolved(self, devices: int) -> tuple[int, ...]:
        """The mesh shape over `devices` devices: `shape`, or every device on the data axis."""
        return tuple(int(s) for s in self.shape) if self.shape else (devices, 1, 1)


@dataclass(frozen=True)
class OutputSettings:
    dir: str = "runs/default"
    checkpoint_every: int = 20
    keep: int = 3
    tensorboard: bool = True
    progress: bool = True
    export_adapters: bool = True
    save_rollouts: bool = False

    def __post_init__(self):
        at_least("output", self, 1, "checkpoint_every", "keep")


@dataclass(frozen=True)
class RetrieverSettings:
    """The <search> tool: a Search-R1 retrieval server at `url`, else the index directory `index_dir`
    (launch.build_index), else an index of `corpus` by `encoder` built on first use. Prefixes "" take
    the index's meta.json (detected from the encoder: "query: " / "passage: " for E5). `kind`: the local
    index's retriever, "dense" (faiss, `encoder`) or "lexical" (SQLite FTS5 BM25: tools/lexical.py)."""
    url: str = ""
    index_dir: str = ""
    corpus: str = "data/corpus/wiki_sample.jsonl"
    encoder: str = "all-minilm-l6-v2"
    topk: int = 3
    query_prefix: str = ""
    passage_prefix: str = ""
    kind: str = "dense"

    def __post_init__(self):
        at_least("retriever", self, 1, "topk")
        if self.kind not in RETRIEVER_KINDS:
            raise UserError(f"retriever.kind={self.kind!r}; expected one of {', '.join(RETRIEVER_KINDS)}")
        if self.kind == "lexical" and (self.query_prefix or self.passage_prefix):
            raise UserError("retriever.query_prefix / passage_prefix are the dense encoder's; a lexical index has "
                            "none: drop them or set retriever.kind=dense")


@dataclass(frozen=True)
class ToolSettings:
    sql_timeout_s: float = 5.0      # the SQL tool's per-query timeout (the reward's: reward.sql_timeout_s)


@dataclass(frozen=True)
class RouterSettings:
    convention: str = "dart_jax"    # ψ's convention (roles.router): dart_jax | authors


@dataclass(frozen=True)
class AlgoSettings:
    norm_adv_by_std: bool = True    # GRPO advantages divided by the group's standard deviation


@dataclass(frozen=True)
class DataSettings:
    train: tuple = field(default=(), metadata=AS_LIST)  # dataset entries (data.readers.load_rows)


@dataclass(frozen=True)
class SFTSettings:
    """launch.sft's section (sft/trainer.py). No defaults for the sizes a warm start must choose."""
    data: tuple = field(metadata=AS_LIST)         # demonstration sources, each with a `builder`
    epochs: int
    batch_size: int
    micro_batch: int
    max_length: int
    val_size: int
    eval_every: int
    protocol_check: int              # held-out questions rolled out before / after (0: none)
    seed: int = 0
    exclude: tuple = field(default=(), metadata=AS_LIST)     # evaluation sets whose questions are removed
    check_data: tuple = field(default=(), metadata=AS_LIST)  # the protocol check's questions (default: held out)
    export_dtype: str = "float32"
    train_tag_rows: bool = True      # the added tags' embedding rows train with the adapters
    sampled_check: bool = True       # the protocol check also sampled at sampling.temperature
    group_by_length: bool = False    # batches of similar lengths (less padding), in a seeded shuffled order

    def __post_init__(self):
        at_least("sft", self, 1, "epochs", "batch_size", "micro_batch", "max_length", "eval_every")
        at_least("sft", self, 0, "val_size", "protocol_check")


SECTIONS: dict[str, type] = {
    "model": ModelSettings, "method": MethodSpec, "loss": LossConfig, "optim": OptimConfig,
    "sampling": SamplingConfig, "rollout": RolloutConfig, "reward": RewardConfig, "train": TrainSettings,
    "eval": EvalSettings, "mesh": MeshSettings, "output": OutputSettings, "retriever": RetrieverSettings,
    "tool": ToolSettings, "router": RouterSettings, "algo": AlgoSettings, "data": DataSettings,
}
DERIVED = {"loss": ("objective",), "rollout": ("route_mode",)}


@dataclass(frozen=True, kw_only=True)
class RunSpec:
    """Everything a run reads from its config, parsed and checked (`run_spec`)."""
    task: str = "qa"                 # qa (Search-R1) | sql (SkyRL-SQL)
    init_from: str = ""              # what to start from (run.policy.INIT_KINDS)
    warm_start: str = ""             # a LoRA warm-start directory (launch.sft) merged into the base
    router_convention: str
    norm_adv_by_std: bool
    model: ModelSettings
    method: MethodSpec
    loss: LossConfig
    optim: OptimConfig
    sampling: SamplingConfig
    rollout: RolloutConfig           # route_mode = method.route_mode
    reward: RewardConfig
    plan: UpdatePlan
    train: TrainSettings
    eval: EvalSettings
    output: OutputSettings
    retriever: RetrieverSettings
    tool: ToolSettings
    mesh: MeshSettings
    data_train: tuple
    sft: SFTSettings | None          # None: not a launch.sft config
    config: Any = field(default=None, compare=False, repr=False)  # the ConfigDict it came from

    def __post_init__(self):
        if self.task not in TASKS:
            raise UserError(f"task={self.task!r}; expected one of {TASKS}")


TOP_LEVEL = ("task", "init_from", "warm_start")


# -- defaults -------------------------------------------------------------------------------------------
def _config_default(f: dataclasses.Field):
    value = f.default_factory() if f.default_factory is not dataclasses.MISSING else f.default
    return list(value) if f.metadata.get("config") is list else value


def section_defaults(cls: type, name: str) -> dict:
    """{field: default} of a section's dataclass, in config form; derived and required fields left out."""
    return {f.name: _config_default(f) for f in dataclasses.fields(cls)
            if f.init and f.name not in DERIVED.get(name, ())
            and (f.default is not dataclasses.MISSING or f.default_factory is not dataclasses.MISSING)}


def defaults(sections: dict[str, type] = SECTIONS) -> dict:
    """Every setting's default as a config: {top-level field: value, section: {field: value}}
    (configs/base.py is this; run.run_dir compares a saved config's absent fields to it)."""
    top = {f.name: f.default for f in dataclasses.fields(RunSpec) if f.name in TOP_LEVEL}
    return {**top, **{name: section_defaults(cls, name) for name, cls in sections.items()}}


# -- parsing and the rules between fields ---------------------------------------------------------------
def section(config, name: str) -> dict:
    """A config section as a dict; lists become tuples (ml_collections keeps tuples as lists)."""
    if name not in config:
        return {}
    return {k: tuple(v) if isinstance(v, list) else v for k, v in dict(config[name]).items()}


def parse(cls: type, name: str, fields: dict, **derived):
    """cls(**fields, **derived); a key the section does not have fails naming section.field."""
    known = {f.name for f in dataclasses.fields(cls) if f.init} - set(DERIVED.get(name, ()))
    unknown = sorted(set(fields) - known)
    if unknown:
        raise UserError(f"unknown setting {', '.join(f'{name}.{k}' for k in unknown)}: config.{name} has "
                        f"{', '.join(sorted(known))}" + (f" ({', '.join(f'{name}.{k}' for k in DERIVED[name])} "
                                                          "is derived, not set)" if name in DERIVED else ""))
    missing = sorted(f.name for f in dataclasses.fields(cls) if f.init and f.name not in fields
                     and f.name not in derived and f.default is dataclasses.MISSING
                     and f.default_factory is dataclasses.MISSING)
    if missing:
        raise UserError(f"config.{name} needs {', '.join(f'{name}.{k}' for k in missing)}")
    return cls(**fields, **derived)


def groups_per_chunk(chunk_rows: int, group_size: int) -> int:
    """GRPO groups per rollout chunk (`rollout.chunk_rows` trajectories; 0 = no chunking). A chunk holds
    whole groups so that each group's prompt is still prefilled once. Raises UserError naming both
    fields when chunk_rows does not split into groups."""
    if chunk_rows < 0 or chunk_rows % group_size:
        raise UserError(f"rollout.chunk_rows={chunk_rows} must be 0 or a multiple of train.group_size "
                        f"({group_size}): a chunk holds whole GRPO groups; set --config.rollout.chunk_rows to "
                        f"0 or a multiple of {group_size}")
    return chunk_rows // group_size


def run_spec(config, nproc: int = 1) -> RunSpec:
    """The config parsed and checked: every section, then the rules between fields (a GRPO run's batch
    split for `nproc` processes; a warm start's variant and batch). Raises UserError / ValueError naming
    the fields."""
    get = {name: section(config, name) for name in SECTIONS}
    method = parse(MethodSpec, "method", get["method"])
    rollout = parse(RolloutConfig, "rollout", get["rollout"], route_mode=method.route_mode)
    loss_fields = get["loss"]
    # seq-mean-token-sum-norm's L: verl pads its response arrays to the configured response length
    loss_fields["norm_length"] = loss_fields.get("norm_length") or rollout.max_response_tokens
    train = parse(TrainSettings, "train", get["train"])
    spec = RunSpec(
        **{k: config[k] for k in TOP_LEVEL if k in config},
        router_convention=parse(RouterSettings, "router", get["router"]).convention,
        norm_adv_by_std=parse(AlgoSettings, "algo", get["algo"]).norm_adv_by_std,
        model=parse(ModelSettings, "model", get["model"]), method=method,
        loss=parse(LossConfig, "loss", loss_fields), optim=parse(OptimConfig, "optim", get["optim"]),
        sampling=parse(SamplingConfig, "sampling", get["sampling"]), rollout=rollout,
        reward=parse(RewardConfig, "reward", get["reward"]),
        plan=UpdatePlan(train.mini_batch, train.micro_batch, train.ppo_epochs, train.shuffle_minibatches,
                        train.seed, train.old_logp, train.share_prefix, train.pad_multiple,
                        train.micro_batch_padding),
        train=train, eval=parse(EvalSettings, "eval", get["eval"]),
        output=parse(OutputSettings, "output", get["output"]),
        retriever=parse(RetrieverSettings, "retriever", get["retriever"]),
        tool=parse(ToolSettings, "tool", get["tool"]), mesh=parse(MeshSettings, "mesh", get["mesh"]),
        data_train=parse(DataSettings, "data", get["data"]).train,
        sft=parse(SFTSettings, "sft", section(config, "sft")) if "sft" in config else None, config=config)
    if spec.sft is None:
        check_grpo(spec, nproc)
    else:
        check_sft(spec)
    return spec


def check_grpo(spec: RunSpec, nproc: int) -> None:
    """A GRPO run's rules: the batch splits as the update and the `nproc` processes need it, and the
    method, sampler and update settings agree."""
    tc, method, plan = spec.train, spec.method, spec.plan
    groups_per_chunk(spec.rollout.chunk_rows, tc.group_size)
    if method.variant == "2agent" and spec.router_convention != "dart_jax":
        raise UserError("method.variant='2agent' needs router.convention='dart_jax': a token's log-prob comes "
                        "from the model that wrote it, the model in control after the token before (the "
                        f"composition's rule); the {spec.router_convention!r} convention's roles are shifted "
                        "by one token and would train the first token of each tool span through the other model")
    if plan.share_prefix and method.variant in ("mixlora", "2agent"):
        raise UserError("train.share_prefix runs a group's prompt once for all its rows: not with "
                        f"method.variant={method.variant!r} (MixLoRA's load balance and the 2-Agent "
                        "composition count every row's tokens): set --config.train.share_prefix=False")
    # LoRA dropout draws its mask by the array's shape: one mask for a shared prompt, another for a narrower
    # micro-batch, so either would change the update
    fixes = ["--config.train.share_prefix=False"] * plan.share_prefix + \
        ["--config.train.micro_batch_padding=mini_batch"] * (plan.micro_batch_padding == "own")
    if method.dropout > 0 and fixes:
        raise UserError(f"method.dropout={method.dropout} draws its masks by the shape of what runs, which "
                        "train.share_prefix (a group's prompt run once) and train.micro_batch_padding='own' "
                        f"(each micro-batch cut to its own width) change: set {' '.join(fixes)}")
    if plan.share_prefix and (tc.micro_batch > tc.group_size or tc.group_size % tc.micro_batch):
        raise UserError(f"train.share_prefix shares a prompt within a micro-batch: train.micro_batch "
                        f"({tc.micro_batch}) must divide train.group_size ({tc.group_size}), so that each "
                        "micro-batch holds rows of one group")
    if plan.old_logp == "sampler" and spec.sampling.temperature != spec.loss.temperature:
        raise UserError(f"train.old_logp='sampler' needs sampling.temperature ({spec.sampling.temperature}) "
                        f"== loss.temperature ({spec.loss.temperature}): the sampler records log-probs "
                        "at its own temperature")
    n_traj = tc.prompts_per_step * tc.group_size
    if n_traj % tc.mini_batch or tc.mini_batch % tc.micro_batch:
        raise UserError(f"train.prompts_per_step × train.group_size = {n_traj} must be a multiple of "
                        f"train.mini_batch ({tc.mini_batch}), itself a multiple of train.micro_batch "
                        f"({tc.micro_batch})")
    if tc.prompts_per_step % nproc:
        raise UserError(f"train.prompts_per_step={tc.prompts_per_step} must divide among {nproc} processes "
                        "(each rolls out whole GRPO groups)")


def check_sft(spec: RunSpec) -> None:
    """A warm start's rules: a variant SFT can export, and whole micro-batches per batch."""
    if spec.method.variant not in SFT_VARIANTS:
        raise UserError(f"launch.sft trains a warm start with method.variant lora, dart or full; got "
                        f"{spec.method.variant!r} (MixLoRA and 2-Agent are RL baselines: launch.train)")
    sc = spec.sft
    if sc.batch_size % sc.micro_batch:
        raise UserError(f"sft.batch_size ({sc.batch_size}) must be a multiple of sft.micro_batch ({sc.micro_batch})")
