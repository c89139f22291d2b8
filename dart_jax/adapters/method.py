"""Method variants as configuration: which adapters exist, how tokens route, what trains.

| variant | adapters            | routes                         | trainable (optimizer sees) |
|---------|---------------------|--------------------------------|----------------------------|
| full    | none                | −1 everywhere                  | the base tree              |
| lora    | {"shared"}          | 0 on every real position       | the shared adapter only    |
| dart    | {"reasoning","tool"}| router role (0 reas., 1 tool)  | both adapters only         |
| mixlora | {"shared" (q,k,v,o LoRA), "experts" (FFN LoRA experts + gate)} | 0 on every real position; the FFN mixes its experts by a learned top-k gate (models.mixlora) | adapters, experts, gates |
| 2agent  | none: two full models {"reasoning", "tool"} (`TwoModels`) | router role picks the *model* whose log-prob a token gets | both models' every weight |
| 2agent, agent_params="lora" | {"reasoning","tool"}: one LoRA per model over the frozen base | as 2agent; each model's forward applies its LoRA to every token | both LoRAs only |

`role_mask` ("both" | "reasoning" | "tool") keeps only that role's tokens in the policy gradient
(CEA's M_Unified / M_Reas / M_Tool: the paper's role mask m_t). `isolation` ("forward" | "strict") applies
to dart (see `dart_jax.adapters.isolation`). MixLoRA (`experts`, `top_k` of rank `rank` each,
`router_aux_coef` for the load-balancing loss) puts a plain LoRA on the attention projections
among `targets` and LoRA experts on the FFN; the paper's comparison at DART's budget is E = 2
experts of rank 8, top-2; E = 8, top-2, rank 16 is MoE-PEFT's template. Two-model routing
(2-Agent, H_Tool, H_Reas) routes roles to two (base, adapters) pairs (rollout.compose).

Routing is decided here only: ψ (roles.router) gives each position a role; a method's `route_mode`
("role" | "shared" | "none", what the sampler's forward uses) turns roles into route ids
(`mode_routes`); `routes_for` gives the route ids its trajectories and train batches carry (2-Agent's:
the roles, from which `two_model_logprobs` picks each token's model; `two_model_route_mode` is each of
its models' own). MixLoRA's experts replace the FFN of the transformer block through the FFN-adapter
hook (models.lora.ffn_adapter); `gate_aux` says its forward reports their gate statistics.

2-Agent with `agent_params="lora"` (the cheaper option: two LoRA sets over two frozen copies)
keeps one frozen base in memory: two frozen copies of the same weights are the same function, so the
models differ only by their LoRAs. Unlike DART, which routes each token to an adapter inside *one*
forward (a tool token attends to keys and values the reasoning adapter computed), each 2-Agent model
runs its own forward over the whole trajectory with its LoRA on every token, and a token takes the
log-prob of the model that wrote it.
"""  # noqa: E501 (a markdown table: its rows cannot wrap)

from __future__ import annotations

import dataclasses
from typing import Any

import flax.struct
import jax
import jax.numpy as jnp

from dart_jax.models import lora as lora_lib, mixlora as mixlora_lib
from dart_jax.models.config import ModelConfig
from dart_jax.roles.router import PAD_ROLE, REASONING, TOOL, loss_roles

VARIANTS = ("full", "lora", "dart", "mixlora", "2agent")
ROUTE_MODES = ("role", "shared", "none")
# variant -> route mode of its single-model forward (`mode_routes`)
_ROUTE_MODE = {"dart": "role", "lora": "shared", "mixlora": "shared", "full": "none", "2agent": "none"}
ATTENTION = ("q", "k", "v", "o")
ROLE_MASKS = ("both", "reasoning", "tool", "answer")
ISOLATIONS = ("forward", "strict")
AGENT_PARAMS = ("full", "lora")


@dataclasses.dataclass(frozen=True)
class MethodSpec:
    variant: str = "dart"
    rank: int = 8
    alpha: float = 16.0
    targets: tuple[str, ...] = lora_lib.TARGETS
    init: str = "normal"
    init_std: float = 0.02
    rslora: bool = False
    dropout: float = 0.0
    isolation: str = "forward"
    role_mask: str = "both"
    adapter_dtype: str = "float32"
    experts: int = 2                # mixlora: FFN experts, each a LoRA of `rank` on gate, up and down
    top_k: int = 2                  # mixlora: experts mixed per token
    router_aux_coef: float = 0.001  # mixlora: load-balancing loss coefficient (MoE-PEFT's default)
    agent_params: str = "full"      # 2agent: "full" (two full models) | "lora" (a LoRA each, frozen base)

    def __post_init__(self):
        for field, allowed in (("variant", VARIANTS), ("role_mask", ROLE_MASKS), ("isolation", ISOLATIONS),
                               ("agent_params", AGENT_PARAMS)):
            if getattr(self, field) not in allowed:
                raise ValueError(f"method.{field}={getattr(self, field)!r}; expected one of {allowed}")
        if self.variant == "mixlora" and not 1 <= self.top_k <= self.experts:
            raise ValueError(f"method.top_k={self.top_k} with method.experts={self.experts}; expected "
                             "1 ≤ top_k ≤ experts")
        if self.variant == "mixlora" and self.dropout > 0:
            raise ValueError("method.dropout > 0 with mixlora: the FFN experts take no LoRA dropout here; set "
                             "method.dropout = 0")
        if self.two_lora and self.dropout > 0:
            raise ValueError("method.dropout > 0 with 2-Agent LoRAs: their LoRAs take no dropout here; set "
                             "method.dropout = 0")
        if self.agent_params != "full" and self.variant != "2agent":
            raise ValueError(f"method.agent_params={self.agent_params!r} is a 2-Agent option; variant is "
                             f"{self.variant!r}")
        if self.isolation == "strict" and self.variant != "dart":
            raise ValueError(f"isolation='strict' needs two role adapters (variant 'dart'), got {self.variant!r}")
        bad = set(self.targets) - set(lora_lib.TARGETS)
        if bad:
            raise ValueError(f"method.targets has unknown projections {sorted(bad)}; "
                             f"expected some of {lora_lib.TARGETS}")

    @property
    def adapter_names(self) -> tuple[str, ...]:
        if self.two_lora:
            return ("reasoning", "tool")
        return {"full": (), "lora": ("shared",), "dart": ("reasoning", "tool"),
                "mixlora": ("experts", "shared"), "2agent": ()}[self.variant]

    @property
    def route_mode(self) -> str:
        """How a single-model forward routes tokens to adapters (`mode_routes`): "role" (dart: ψ's role
        picks the adapter), "shared" (lora, mixlora: adapter 0 on every token), "none" (full, 2agent:
        no routed adapter; 2-Agent routes roles to *models*: `two_model_route_mode`)."""
        return _ROUTE_MODE[self.variant]

    @property
    def trajectory_route_mode(self) -> str:
        """The route mode of the route ids its trajectories record and its train batches carry
        (`routes_for`): its `route_mode`, except 2-Agent's, whose two-model composition records ψ's
        roles (rollout.compose), from which `two_model_logprobs` picks each token's model."""
        return "role" if self.variant == "2agent" else self.route_mode

    @property
    def gate_aux(self) -> bool:
        """Whether its forward reports MixLoRA's expert-gate statistics (the load-balancing loss,
        metric "router_aux")."""
        return self.variant == "mixlora"

    @property
    def two_lora(self) -> bool:
        """2-Agent as two LoRA sets over the frozen base."""
        return self.variant == "2agent" and self.agent_params == "lora"

    @property
    def trains_base(self) -> bool:
        return self.variant == "full" or (self.variant == "2agent" and not self.two_lora)


def init_adapters(spec: MethodSpec, cfg: ModelConfig, key: jax.Array) -> dict[str, lora_lib.LoraAdapter] | None:
    if not spec.adapter_names:
        return None
    if spec.variant == "mixlora":
        attn = tuple(t for t in spec.targets if t in ATTENTION)
        experts = mixlora_lib.init_experts(cfg, jax.random.fold_in(key, 1), spec.experts, spec.top_k, spec.rank,
                                           spec.alpha, spec.init, spec.init_std, jnp.dtype(spec.adapter_dtype),
                                           spec.rslora)
        out = {"experts": experts}
        if attn:
            out["shared"] = lora_lib.init_lora(cfg, jax.random.fold_in(key, 0), spec.rank, spec.alpha, attn,
                                               spec.init, spec.init_std, spec.rslora, spec.dropout,
                                               jnp.dtype(spec.adapter_dtype))
        return out
    return {name: lora_lib.init_lora(cfg, jax.random.fold_in(key, i), spec.rank, spec.alpha,
                                     spec.targets, spec.init, spec.init_std, spec.rslora,
                                     spec.dropout, jnp.dtype(spec.adapter_dtype))
            for i, name in enumerate(spec.adapter_names)}


def mode_routes(mode: str, roles: jnp.ndarray) -> jnp.ndarray:
    """ψ's roles i32[...] (−1 padding) -> the route ids i32[...] a forward under route mode `mode`
    uses (models.lora: −1 = no adapter): "role" the roles themselves (sorted adapter names give
    reasoning = 0, tool = 1: the same ids as the roles), "shared" adapter 0 on every real position,
    "none" −1 everywhere."""
    if mode == "role":
        return roles.astype(jnp.int32)
    if mode == "shared":
        return jnp.where(roles == PAD_ROLE, -1, 0).astype(jnp.int32)
    if mode == "none":
        return jnp.full(roles.shape, -1, jnp.int32)
    raise ValueError(f"route_mode={mode!r}; expected one of {ROUTE_MODES}")


def routes_for(spec: MethodSpec, roles: jnp.ndarray) -> jnp.ndarray:
    """ψ's roles i32[B, T] (−1 padding) -> the route ids of the method's trajectories and train
    batches (`MethodSpec.trajectory_route_mode`)."""
    return mode_routes(spec.trajectory_route_mode, roles)


def role_token_mask(spec: MethodSpec, token_roles: jnp.ndarray, answer_span: jnp.ndarray | None = None) -> jnp.ndarray:
    """f32[B, T] m_t: 1 where token t's (loss) role keeps its gradient under `role_mask`.
    "answer" (the DART authors' M_Reas: only the final answer span, tags included) needs
    `answer_span` (bool[B, T], rl.batch.answer_span_mask)."""
    if spec.role_mask == "both":
        keep = token_roles != PAD_ROLE
    elif spec.role_mask == "reasoning":
        keep = token_roles == REASONING
    elif spec.role_mask == "tool":
        keep = token_roles == TOOL
    else:
        if answer_span is None:
            raise ValueError("role_mask 'answer' needs the answer tags' token sequences (the task's protocol) to "
                             "find the answer span")
        keep = (token_roles != PAD_ROLE) & answer_span
    return keep.astype(jnp.float32)


@flax.struct.dataclass
class TwoModels:
    """The 2-Agent policy: two independent models (each a whole base tree, and optionally a LoRA
    applied to every token: `agent_params="lora"`), one per role. Token t's log-prob is the model in
    control after token t − 1 (its loss role: rl.step), each model runs its forward over the whole
    trajectory with its own weights, and rollouts go through the two-model composition
    (rollout.compose)."""
    reasoning: Any
    tool: Any
    reasoning_adapters: Any = None  # {"shared": LoraAdapter} or None
    tool_adapters: Any = None

    def models(self) -> tuple[tuple[Any, Any], tuple[Any, Any]]:
        """((base, adapters) of the reasoning model, (base, adapters) of the tool model)."""
        return (self.reasoning, self.reasoning_adapters), (self.tool, self.tool_adapters)


def two_model_route_mode(adapters) -> str:
    """Route mode of one 2-Agent model's own forward: its LoRA (agent_params="lora") on every token,
    or none."""
    return "none" if adapters is None else "shared"


def two_model_logprobs(models: TwoModels, roles: jnp.ndarray, score) -> tuple[jnp.ndarray, ...]:
    """2-Agent's per-token values: each model runs `score(base, adapters, route_ids)` -> a tuple of
    f32[B, T] arrays (log-prob, entropy) over the whole trajectory, its LoRA, if any, on every real
    token (`two_model_route_mode`); token t takes the values of the model that wrote it, the one in
    control after token t − 1 (its loss role, from ψ's `roles` i32[B, T]). Each model's gradient
    therefore comes from its own role's tokens only."""
    writer = loss_roles(roles)
    outs = [score(b, a, None if a is None else mode_routes(two_model_route_mode(a), roles))
            for b, a in models.models()]
    pick = writer == TOOL
    return tuple(jnp.where(pick, tool, reas) for reas, tool in zip(*outs))


def trainable(spec: MethodSpec, base: Any, adapters: Any) -> Any:
    """The tree the optimizer sees (and gradients are taken w.r.t.); 2agent: both models, each
    starting from the base."""
    if spec.variant == "2agent" and not spec.two_lora:
        return {"reasoning": base, "tool": base}
    return base if spec.trains_base else adapters


def model_trees(spec: MethodSpec, params: Any, base: Any, adapters: Any) -> tuple[Any, Any]:
    """(base, adapters) for the forward pass, with `params` (the trainable tree) substituted
    (2agent: (TwoModels, None))."""
    if spec.two_lora:
        return TwoModels(base, base, {"shared": params["reasoning"]}, {"shared": params["tool"]}), None
    if spec.variant == "2agent":
        return TwoModels(params["reasoning"], params["tool"]), None
    return (params, adapters) if spec.trains_base else (base, params)
