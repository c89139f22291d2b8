"""Fixed-retrieval evaluation (the paper's analysis of reasoning against tool use): replay the
documents another run retrieved, so EM differences between two policies come from reasoning only.

The recorded run is a trajectory file: `per_question.jsonl` of `launch.evaluate` (each record's
`tool_calls[k].observation`) or a training run's `rollouts.jsonl` (the observation pieces). The
k-th tool call of a question receives the recorded run's k-th observation for that question; calls
past the recorded ones receive its last one; a question the recorded run never searched for gets an
empty observation. Each case is counted and reported. A last line cut short by a crash mid-write is
skipped (logged: `run.records.read_records`).
"""

from __future__ import annotations

import re
from collections import Counter

from dart_jax.data.readers import question_key
from dart_jax.rollout.protocol import Protocol
from dart_jax.run.records import read_records


def recorded_observations(path: str, protocol: Protocol) -> tuple[dict, dict]:
    """-> ({uid: [observation, ...]}, {question key: [observation, ...]}), the first record of each
    question (sample 0 when the file holds several samples)."""
    body = re.compile(re.escape(protocol.obs_open) + r"(.*?)" + re.escape(protocol.obs_close), re.S)
    by_uid: dict[str, list[str]] = {}
    by_question: dict = {}
    from_sample0 = {id(by_uid): set(), id(by_question): set()}  # keys whose record is a sample 0
    for k, rec in enumerate(read_records(path)):
        uid = rec.get("id", rec.get("uid"))
        if uid is None or "question" not in rec:
            raise ValueError(f"{path}: record {k} has no id/uid or question: not a trajectory file")
        if "tool_calls" in rec:
            obs = [c.get("observation") or "" for c in rec["tool_calls"]]
        elif "pieces" in rec:
            obs = [m.group(1) for p in rec["pieces"] if not p.get("loss") for m in body.finditer(p["text"])]
        else:
            raise ValueError(f"{path}: record {k} has neither 'tool_calls' (launch.evaluate) nor 'pieces' "
                             "(training rollouts.jsonl)")
        uid, qkey, first = str(uid), question_key(rec), rec.get("sample", 0) == 0
        for table, key in ((by_uid, uid), (by_question, qkey)):
            if key not in table or (first and key not in from_sample0[id(table)]):
                table[key] = obs
                if first:
                    from_sample0[id(table)].add(key)
    return by_uid, by_question


class FixedRetrieval:
    """The agent's tool function, replaying recorded observations (see the module doc)."""

    def __init__(self, path: str, protocol: Protocol):
        if protocol.name != "qa":
            raise ValueError("fixed retrieval replays retrieved documents: a QA (search) mode")
        self.path = path
        self.by_uid, self.by_question = recorded_observations(path, protocol)
        self.calls: Counter = Counter()
        self.stats: Counter = Counter()

    def reset(self) -> None:
        self.calls.clear()

    def _recorded(self, meta: dict) -> list[str] | None:
        obs = self.by_uid.get(str(meta["uid"]))
        return obs if obs is not None else self.by_question.get(question_key(meta))

    def __call__(self, queries: list[str], metas: list[dict]) -> list[str]:
        out = []
        for meta in metas:
            k = self.calls[(meta["uid"], meta.get("sample", 0))]
            self.calls[(meta["uid"], meta.get("sample", 0))] += 1
            obs = self._recorded(meta)
            if not obs:
                self.stats["no_recorded_retrieval"] += 1
                out.append("")
            elif k < len(obs):
                self.stats["replayed"] += 1
                out.append(obs[k])
            else:
                self.stats["past_recorded_calls"] += 1
                out.append(obs[-1])
        return out
