"""Exports of a loaded policy for other servers and libraries (launch.export; docs/serving.md):

    base/              the serving base as an HF model (the base model, its warm start merged, the trained
                       rows of the tool tags)
    peft/<adapter>/    each adapter as a PEFT LoRA directory whose base is base/
    merged-<adapter>/  base/ with that one adapter merged: an HF model any stock server runs, one role
    dart/              the DART adapter directory (manifest with router tags and convention, the adapters,
                       the tag rows): what launch.serve / launch.evaluate / init_from load
"""

from __future__ import annotations

import json
import os

import jax
import numpy as np
from safetensors.numpy import save_file

from dart_jax.checkpoints.dart_io import export_dart
from dart_jax.checkpoints.hf_export import base_to_hf_tensors, hf_config_dict
from dart_jax.checkpoints.peft_io import export_peft, merge_adapter

README = """# {name}

Exported by `python -m launch.export --checkpoint={checkpoint}` (dart_jax). Router: `{open}` opens and
`{close}` closes a tool span ({convention} convention: every token inside a span, its closing tag
included, is written by the tool adapter; everything else by the reasoning adapter).

{parts}

Per-token routing (a reasoning and a tool adapter inside one sequence) is not what stock multi-LoRA
servers do: they apply one adapter per request. `python -m launch.serve --checkpoint=dart` serves it as
trained; with a stock server, run `merged-reasoning/` and `merged-tool/` as two models and hand the
sequence over at the tags. dart_jax/parity/torch_routed.py is a PyTorch reference that decodes with
`base/` and the `peft/` pair, routed per token.
"""
PART_LINES = {
    "base": "- `base/`: the serving base (HF): the base model, the warm start merged, the trained tag rows.",
    "peft": "- `peft/<adapter>/`: each adapter as PEFT LoRA on `base/` (`PeftModel.from_pretrained(base, dir)`).",
    "merged": "- `merged-<adapter>/`: `base/` with that one adapter merged (HF): a single-role model for any server.",
    "dart": "- `dart/`: the DART adapter directory: `launch.serve --checkpoint=dart`, `launch.evaluate`, `init_from`.",
}


def save_model(base, cfg, out_dir: str, tokenizer, dtype: str = "float32") -> str:
    """An HF directory (safetensors, config.json, tokenizer) of `base`, stored as `dtype`."""
    os.makedirs(out_dir, exist_ok=True)
    tensors = {k: np.ascontiguousarray(v.astype(dtype) if np.issubdtype(v.dtype, np.floating) else v)
               for k, v in base_to_hf_tensors(base, cfg).items()}
    save_file(tensors, os.path.join(out_dir, "model.safetensors"), metadata={"format": "pt"})
    with open(os.path.join(out_dir, "config.json"), "w") as f:
        json.dump({**hf_config_dict(cfg), "torch_dtype": dtype}, f, indent=2)
    tokenizer.save_pretrained(out_dir)
    return out_dir


def export_policy(policy, spec, out: str, parts: set[str], dtype: str = "float32", checkpoint: str = "") -> dict:
    """Write `parts` (module doc) of `policy` (eval.policy.EvalPolicy) under `out`. -> {part: path}."""
    if "peft" in parts and "base" not in parts:
        raise ValueError("the peft export sits on base/: export base too (--parts=base,peft)")
    adapters = policy.adapters or {}
    if not adapters and ({"peft", "merged", "dart"} & parts):
        raise ValueError(f"{checkpoint or 'the policy'} has no adapters ({policy.source.get('variant')}): only "
                         "--parts=base applies")
    cfg, tok, base = policy.cfg, policy.tokenizer, jax.device_get(policy.base)
    os.makedirs(out, exist_ok=True)
    written: dict[str, str] = {}
    if "base" in parts:
        written["base"] = save_model(base, cfg, os.path.join(out, "base"), tok, dtype)
    for name in sorted(adapters):
        if "peft" in parts:
            written[f"peft/{name}"] = export_peft(adapters[name], cfg, os.path.join(out, "peft", name),
                                                  base_model_name_or_path=os.path.abspath(written["base"]),
                                                  dtype=dtype)
        if "merged" in parts:
            written[f"merged-{name}"] = save_model(merge_adapter(base, adapters[name]), cfg,
                                                   os.path.join(out, f"merged-{name}"), tok, dtype)
    router = spec.router_convention if policy.router_convention is None else policy.router_convention
    from dart_jax.rollout.protocol import PROTOCOLS
    protocol = PROTOCOLS[spec.task]
    if "dart" in parts:
        written["dart"] = export_dart(os.path.join(out, "dart"), adapters, cfg, base, tok, protocol.tool_open,
                                      protocol.tool_close, router, base_model=spec.model.path,
                                      extra={"kind": "dart", "warm_start": policy.source.get("warm_start") or "",
                                             "exported_from": checkpoint}, dtype=dtype)
    with open(os.path.join(out, "README.md"), "w") as f:
        f.write(README.format(name=os.path.basename(os.path.normpath(out)), checkpoint=checkpoint,
                              open=protocol.tool_open, close=protocol.tool_close, convention=router,
                              parts="\n".join(PART_LINES[p] for p in PART_LINES if p in parts)))
    written["readme"] = os.path.join(out, "README.md")
    return written
