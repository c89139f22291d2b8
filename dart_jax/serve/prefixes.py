"""Shared prompt prefixes for the serving engine (serve.engine): a prompt whose first ≥ `min_prefix`
tokens (rounded down to `slots.PREFIX_STEP`) equal a recent prompt's makes those tokens a shared prefix,
prefilled once (its last token held pending, as rollout.compose resumes a policy) and kept in an LRU
of `size` entries; later prompts that start with it take its KV slots (`slots.place_prefix`) and encode
only the rest, as an observation is appended. The tokens are the same as prefilling the whole prompt
(floating-point rounding aside: tests/serve/test_engine.py)."""

from __future__ import annotations

import collections
from typing import Callable, Iterator

from dart_jax.rollout.sampler import DecodeState
from dart_jax.serve.slots import PREFIX_STEP, common_prefix


class PrefixCache:
    """The engine's learnt prefixes, by their tokens. `prefill(tokens)` makes a prefix's one-row state;
    `widest`: the most tokens the rest of a prompt may have (the widest observation width, since it is
    encoded as one); `stats` (the engine's counter) gets `prefixes` (learnt) and `prefix_hits`."""

    def __init__(self, prefill: Callable[[tuple], DecodeState], widest: int, stats: collections.Counter,
                 min_prefix: int = 32, size: int = 8, recent: int = 16):
        self.prefill, self.widest, self.stats = prefill, int(widest), stats
        self.min_prefix, self.size = int(min_prefix), int(size)
        self.entries: collections.OrderedDict[tuple, DecodeState] = collections.OrderedDict()
        self.recent: collections.deque[tuple] = collections.deque(maxlen=recent)  # prompts a prefix is learnt from

    def __iter__(self) -> Iterator[tuple]:
        return iter(self.entries)

    def __len__(self) -> int:
        return len(self.entries)

    def states(self) -> list[DecodeState]:
        return list(self.entries.values())

    def find(self, prompt: tuple) -> tuple[tuple, DecodeState] | None:
        """The shared prefix `prompt` starts with, as (its tokens, its one-row state): a known one, or one
        learnt now from a recent prompt; None when there is none (or reuse is off: `min_prefix` ≤ 0)."""
        if self.min_prefix <= 0:
            return None
        for key in reversed(self.entries):
            if len(key) < len(prompt) and prompt[:len(key)] == key and len(prompt) - len(key) <= self.widest:
                self.entries.move_to_end(key)
                self.stats["prefix_hits"] += 1
                return key, self.entries[key]
        # another prompt (a repeated one, e.g. several samples of a question, would teach its own whole self)
        n = max((common_prefix(prompt, q) for q in self.recent if q != prompt), default=0)
        if prompt not in self.recent:
            self.recent.append(prompt)
        n = min(n, len(prompt) - 1) // PREFIX_STEP * PREFIX_STEP
        if n < max(self.min_prefix, 2) or len(prompt) - n > self.widest:
            return None
        key = tuple(prompt[:n])
        self.entries[key] = self.prefill(key)
        while len(self.entries) > self.size:
            self.entries.popitem(last=False)
        self.stats["prefixes"] += 1
        return key, self.entries[key]
