"""Cross-framework check of the plain model: dart_jax vs PyTorch transformers on the same inputs.

Reports max |Δlogit| and max |Δlog-prob| over every non-padding position of a left-padded batch,
and greedy-token agreement of our KV-cached decode against `generate`. torch is imported here
only (the reference side); nothing in the training path needs it.
"""

from __future__ import annotations

import dataclasses
import json
import os
import time

import jax
import numpy as np

from dart_jax.checkpoints.registry import load_model
from dart_jax.models.generate import greedy_generate, left_pad
from dart_jax.models.names import is_gguf, resolve
from dart_jax.models.transformer import forward
from dart_jax.tokenization.tokenizer import encode_chat, load_tokenizer

DEFAULT_PROMPTS = os.path.join(os.path.dirname(__file__), "..", "..", "data", "crosscheck_prompts.jsonl")


@dataclasses.dataclass
class ModelReport:
    model: str
    num_prompts: int
    num_positions: int
    max_abs_logit_diff: float
    max_abs_logprob_diff: float
    greedy_tokens: int
    greedy_agree: int
    first_disagreement: list
    seconds: float
    max_abs_logit: float = 0.0      # the scale of the compared values (max |transformers logit|)
    max_abs_logprob: float = 0.0    # max |transformers log-prob| over the compared positions

    def to_dict(self) -> dict:
        return dataclasses.asdict(self)

    def text(self) -> str:
        return (f"model {self.model}: {self.num_prompts} prompts, {self.num_positions} positions\n"
                f"  max |Δlogit|    {self.max_abs_logit_diff:.3e}\n"
                f"  max |Δlog-prob| {self.max_abs_logprob_diff:.3e}\n"
                f"  greedy agreement {self.greedy_agree}/{self.greedy_tokens}")


def load_prompts(path: str | None) -> list[list[dict]]:
    path = path or DEFAULT_PROMPTS
    out = []
    with open(path) as f:
        for n, line in enumerate(f, 1):
            if not line.strip():
                continue
            row = json.loads(line)
            if "messages" in row:
                out.append(row["messages"])
            elif "prompt" in row:
                out.append([{"role": "user", "content": row["prompt"]}])
            else:
                raise ValueError(f"{path}:{n}: expected a 'messages' or 'prompt' field")
    if not out:
        raise ValueError(f"{path}: no prompts")
    return out


def load_torch_model(path: str):
    import torch
    import transformers
    if is_gguf(path):
        model = transformers.AutoModelForCausalLM.from_pretrained(
            os.path.dirname(os.path.abspath(path)), gguf_file=os.path.basename(path), dtype=torch.float32)
    else:
        model = transformers.AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32)
    return model.eval()


def _log_softmax(x: np.ndarray) -> np.ndarray:
    x = x.astype(np.float64)
    m = x.max(-1, keepdims=True)
    return x - m - np.log(np.exp(x - m).sum(-1, keepdims=True))


def crosscheck_model(model: str, prompts_path: str | None = None, max_new_tokens: int = 32,
                     tokenizer=None, torch_model=None) -> ModelReport:
    import torch
    t0 = time.time()
    path = resolve(model)
    tok = tokenizer or load_tokenizer(path)
    cfg, base = load_model(path)
    ref = torch_model or load_torch_model(path)
    prompts = [encode_chat(tok, m) for m in load_prompts(prompts_path)]
    pad = tok.pad_token_id if tok.pad_token_id is not None else 0
    tokens, positions = left_pad(prompts, pad)
    valid = np.asarray(positions) >= 0
    ours, _ = jax.jit(forward, static_argnames="cfg")(base, None, tokens, positions, None, None, cfg=cfg)
    ours = np.asarray(ours)
    with torch.no_grad():
        theirs = ref(input_ids=torch.tensor(np.asarray(tokens)),
                     attention_mask=torch.tensor(valid.astype(np.int64)),
                     position_ids=torch.tensor(np.maximum(np.asarray(positions), 0))).logits.float().numpy()
    dlogit = float(np.abs(ours - theirs)[valid].max())
    dlogp = float(np.abs(_log_softmax(ours) - _log_softmax(theirs))[valid].max())
    scale_logit, scale_logp = float(np.abs(theirs)[valid].max()), float(np.abs(_log_softmax(theirs))[valid].max())

    gen = np.asarray(greedy_generate(base, None, tokens, positions, cfg=cfg, max_new_tokens=max_new_tokens))
    agree, total, first = 0, 0, []
    for i, p in enumerate(prompts):
        with torch.no_grad():
            out = ref.generate(torch.tensor([p]), attention_mask=torch.ones(1, len(p), dtype=torch.long),
                               max_new_tokens=max_new_tokens, min_new_tokens=max_new_tokens,
                               do_sample=False, eos_token_id=None, pad_token_id=pad)
        hf = out[0, len(p):].numpy()
        same = hf == gen[i, :len(hf)]
        agree += int(same.sum())
        total += max_new_tokens
        if not same.all():
            j = int(np.argmin(same))
            first.append({"prompt": i, "position": j, "ours": int(gen[i, j]), "theirs": int(hf[j])})
    return ModelReport(model=model, num_prompts=len(prompts), num_positions=int(valid.sum()),
                       max_abs_logit_diff=dlogit, max_abs_logprob_diff=dlogp,
                       greedy_tokens=total, greedy_agree=agree, first_disagreement=first,
                       seconds=round(time.time() - t0, 2), max_abs_logit=scale_logit, max_abs_logprob=scale_logp)
