"""TrajectoryBatch: what a rollout hands to rewards and the trainer — token ids only.

Row b holds prompt + response in ids[b, :length[b]] (right-padded with 0, positions −1 there).
loss_mask is 1 exactly on sampled tokens; observations and the prompt are 0. route_ids is the
adapter route of each position the sampler's forward used (−1 on padding; a two-model composition
records ψ's roles: rollout.compose); the trainer's forward uses them after checking they equal the
method's routes of ψ over the ids (rl.batch.recorded_routes). sampler_logprobs is the log-prob each
sampled token had when it was drawn (0 elsewhere).
"""

from __future__ import annotations

import dataclasses

import numpy as np


@dataclasses.dataclass
class TrajectoryBatch:
    ids: np.ndarray               # i32[B, L]
    positions: np.ndarray         # i32[B, L]
    loss_mask: np.ndarray         # f32[B, L]
    route_ids: np.ndarray         # i32[B, L]
    sampler_logprobs: np.ndarray  # f32[B, L]
    prompt_len: np.ndarray        # i32[B]
    length: np.ndarray            # i32[B]
    uids: list                    # prompt uid per row (GRPO groups)
    finish_reason: list           # "answer" | "invalid" | "length" | "budget"
    turns: list                   # per row: list of per-turn dicts (action, query, observation, tokens)
    response_text: list           # decoded response (for rewards and display only)

    @property
    def batch_size(self) -> int:
        return self.ids.shape[0]

    def tool_calls(self) -> np.ndarray:
        return np.asarray([sum(t["action"] == "tool" for t in row) for row in self.turns])


def assemble(prompts: list[list[int]], prompt_routes: list[list[int]], responses: list[dict], uids: list,
             finish: list, turns: list, texts: list, pad_to: int | None = None) -> TrajectoryBatch:
    """responses[b]: {"ids", "mask", "logprobs", "routes"} lists for the response part."""
    lengths = [len(p) + len(r["ids"]) for p, r in zip(prompts, responses)]
    width = max(lengths) if pad_to is None else max(pad_to, max(lengths))
    b = len(prompts)
    ids = np.zeros((b, width), np.int32)
    pos = np.full((b, width), -1, np.int32)
    mask = np.zeros((b, width), np.float32)
    routes = np.full((b, width), -1, np.int32)
    lps = np.zeros((b, width), np.float32)
    for i, (p, pr, r) in enumerate(zip(prompts, prompt_routes, responses)):
        n = lengths[i]
        ids[i, :n] = list(p) + r["ids"]
        pos[i, :n] = np.arange(n)
        mask[i, len(p):n] = r["mask"]
        routes[i, :n] = list(pr) + r["routes"]
        lps[i, len(p):n] = r["logprobs"]
    return TrajectoryBatch(ids, pos, mask, routes, lps, np.asarray([len(p) for p in prompts], np.int32),
                           np.asarray(lengths, np.int32), list(uids), list(finish), turns, texts)
