"""CEA training variants (the paper's Capability Effect Attribution): GRPO keeping only one role's token gradients.

    python -m launch.train --config=configs/cea.py:reas,qwen2.5-3b-base --config.model.path=...
    python -m launch.train --config=configs/cea.py:reas,qwen2.5-3b-base,authors    # the authors' roles
    python -m launch.cea --config=configs/cea.py:qwen2.5-3b-base --config.model.path=...  # the whole experiment

variant: reas (M_Reas) | tool (M_Tool) | unified (M_Unified)
model:   as in configs/paper_qa.py (the paper runs Qwen2.5-3B, Qwen2.5-7B and Llama3.1-8B)
roles:   paper (default): tool = the tokens inside a tool span (the router's tool role), reasoning =
         every other generated token; authors (the DART authors' code): M_Tool on the search span as
         well, M_Reas on the final answer span only (`<answer> … </answer>`, tags included:
         method.role_mask "answer").

Full-parameter GRPO with the Search-R1 protocol and hyper-parameters; the role mask m_t multiplies
the loss mask, so the masked-out role's tokens carry neither loss nor weight in the token mean.
H_Tool / H_Reas are not trained: `launch.evaluate --compose-tool / --compose-reasoning` composes
them from these runs and the base model (rollout.compose).
"""

from ml_collections import ConfigDict

from configs import base, paper_qa

ROLE_MASK = {"paper": {"reas": "reasoning", "tool": "tool", "unified": "both"},
             "authors": {"reas": "answer", "tool": "tool", "unified": "both"}}


def role_masks(roles: str) -> dict:
    """variant -> method.role_mask under the `roles` definitions."""
    if roles not in ROLE_MASK:
        raise ValueError(f"CEA role definitions {roles!r}; expected one of {sorted(ROLE_MASK)}")
    return dict(ROLE_MASK[roles])


def parse(arg: str | None) -> tuple[str, str, str]:
    parts = [p.strip() for p in (arg or "unified,qwen2.5-3b-base").split(",")]
    if parts[0] not in ROLE_MASK["paper"]:  # MODEL[,ROLES]: the whole experiment (launch.cea)
        parts.insert(0, "unified")
    if len(parts) == 2:
        parts.append("paper")
    if len(parts) != 3:
        raise ValueError(f"configs/cea.py:{arg}: expected VARIANT,MODEL[,ROLES]")
    return parts[0], parts[1], parts[2]


def get_config(arg: str | None = None):
    variant, model, roles = parse(arg)
    if roles not in ROLE_MASK:
        raise ValueError(f"CEA role definitions {roles!r}; expected one of {sorted(ROLE_MASK)}")
    if variant not in ROLE_MASK[roles]:
        raise ValueError(f"CEA variant {variant!r}; expected one of {sorted(ROLE_MASK[roles])}")
    c = paper_qa.apply_method(paper_qa.qa_common(base.get(), model), "search_r1")
    c.method.role_mask = ROLE_MASK[roles][variant]
    out = f"runs/cea-{model}" + ("" if roles == "paper" else f"-{roles}")
    c.output.dir = f"{out}/train/{variant}"
    # launch.cea: the three trained variants (this config with each role mask, under out/train/), the six
    # sampled on the paper's sets (first 1,000 questions, 50 samples each at T = 1), β solved
    c.cea = ConfigDict(dict(out=out, roles=roles, role_masks=role_masks(roles), datasets=["nq", "popqa", "triviaqa"],
                            limit=1000, n_samples=50, temperature=1.0, batch=64, seed=0,
                            n_boot=10_000, boot_seed=0, estimator="clip", title=f"CEA on {model}"))
    return c
