"""TrajectoryBatch: what a rollout hands to rewards and the trainer — token ids only.

Row b holds prompt + response in ids[b, :length[b]] (right-padded with 0, positions −1 there).
loss_mask is 1 exactly on sampled tokens; observations and the prompt are 0. route_ids is the
adapter route of each position the sampler's forward used (−1 on padding; a two-model composition
records ψ's roles: rollout.compose); the trainer's forward uses them after checking they equal the
method's routes of ψ over the ids (rl.batch.recorded_routes). sampler_logprobs is the log-prob each
sampled token had when it was drawn (0 elsewhere).

Rewards read only what the model wrote: `reward_text` is the response with each observation's body
replaced by the protocol's neutral rendering (`Protocol.reward_observation`: the wrapper tags the tool
inserted, nothing between), the model's spans decoded from its own ids; `observed` keeps, per row, the
bodies of the tool observations the model received (as appended, capped), which only retrieval
accuracy reads. So an <answer> inside a passage, a </observation> or <solution> inside a SQL cell or
column name can neither earn nor cost a reward. `response_text` (everything, observations included)
is for display and records only.
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
    response_text: list           # decoded response, observations included (display and records only)
    reward_text: list             # the response as rewards read it: observation bodies blanked (module doc)
    observed: list                # per row: bodies of the tool observations received (retrieval accuracy)

    @property
    def batch_size(self) -> int:
        return self.ids.shape[0]

    def tool_calls(self) -> np.ndarray:
        return np.asarray([sum(t["action"] == "tool" for t in row) for row in self.turns])


def concat_batches(parts: list[TrajectoryBatch]) -> TrajectoryBatch:
    """Batches of consecutive rows as one: rows right-padded to the longest trajectory of all parts (as
    one batch of them all pads them), lists joined in order."""
    width = max(p.ids.shape[1] for p in parts)
    pads = {"ids": 0, "positions": -1, "loss_mask": 0, "route_ids": -1, "sampler_logprobs": 0}
    arrays = {k: np.concatenate([np.pad(getattr(p, k), ((0, 0), (0, width - p.ids.shape[1])), constant_values=v)
                                 for p in parts]) for k, v in pads.items()}
    cat = lambda get: [x for p in parts for x in get(p)]  # noqa: E731
    return TrajectoryBatch(**arrays, prompt_len=np.concatenate([p.prompt_len for p in parts]),
                           length=np.concatenate([p.length for p in parts]), uids=cat(lambda p: p.uids),
                           finish_reason=cat(lambda p: p.finish_reason), turns=cat(lambda p: p.turns),
                           response_text=cat(lambda p: p.response_text), reward_text=cat(lambda p: p.reward_text),
                           observed=cat(lambda p: p.observed))


def reward_views(decode, protocol, ids: list[int], spans: list[tuple[int, int, bool]]) -> tuple[str, list[str]]:
    """-> (reward text, observed bodies) of one response: `ids` its ids, `spans` its observations as
    (start, length, is a tool result) in order; `decode(ids) -> str`. Model spans are decoded from their
    own ids; each observation becomes `protocol.reward_observation`; the body of a tool result (between
    its first opening and last closing tag, as `rollout.agent.observation_ids` framed it) goes to
    `observed`."""
    text, observed, at = [], [], 0
    for start, n, tool in spans:
        text += [decode(ids[at:start]), protocol.reward_observation(tool)]
        if tool:
            seen = decode(ids[start:start + n])
            a, e = seen.find(protocol.obs_open), seen.rfind(protocol.obs_close)
            observed.append(seen[a + len(protocol.obs_open):e] if 0 <= a and a + len(protocol.obs_open) <= e
                            else seen)
        at = start + n
    text.append(decode(ids[at:]))
    return "".join(text), observed


def assemble(prompts: list[list[int]], prompt_routes: list[list[int]], responses: list[dict], uids: list,
             finish: list, turns: list, texts: list, pad_to: int | None = None, reward_texts: list | None = None,
             observed: list | None = None) -> TrajectoryBatch:
    """responses[b]: {"ids", "mask", "logprobs", "routes"} lists for the response part. `reward_texts`,
    `observed`: `reward_views` of each row (the agent loop passes them); left out (batches built by
    hand), a row without observation tokens (mask all 1) reads its text and any other row has None,
    which a reward refuses (rewards.training)."""
    if reward_texts is None:
        reward_texts = [None if 0 in r["mask"] else t for r, t in zip(responses, texts)]
        observed = [[] for _ in texts]
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
                           np.asarray(lengths, np.int32), list(uids), list(finish), turns, texts, list(reward_texts),
                           list(observed if observed is not None else [[] for _ in texts]))
