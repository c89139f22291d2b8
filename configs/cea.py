"""CEA training variants (METHOD §2): GRPO keeping only one role's token gradients.

    python -m launch.train --config=configs/cea.py:reas,qwen2.5-3b-base --config.model.path=...

variant: reas (M_Reas, reasoning tokens only) | tool (M_Tool, tool tokens only) | unified (M_Unified)
model:   as in configs/paper_qa.py (the paper runs Qwen2.5-3B, Qwen2.5-7B and Llama3.1-8B)

Full-parameter GRPO with the Search-R1 protocol and hyper-parameters; the role mask m_t multiplies
the loss mask, so the masked-out role's tokens carry neither loss nor weight in the token mean.
"""

from configs import base, paper_qa

ROLE_MASK = {"reas": "reasoning", "tool": "tool", "unified": "both"}


def get_config(arg: str | None = None):
    variant, model = paper_qa.parse(arg, "unified,qwen2.5-3b-base")
    if variant not in ROLE_MASK:
        raise ValueError(f"CEA variant {variant!r}; expected one of {sorted(ROLE_MASK)}")
    c = paper_qa.apply_method(paper_qa.qa_common(base.get(), model), "search_r1")
    c.method.role_mask = ROLE_MASK[variant]
    c.output.dir = f"runs/cea-{variant}-{model}"
    return c
