"""The sample stage of launch.grad_angles (experiments.grad_run): G trajectories per query by the policy at
T = `temperature`, `chunk` queries at a time, until `queries` groups with mixed outcomes are in hand.

    rollouts/chunk_NNN.npz    ids, positions, loss mask, scores, accuracy of each chunk's G·chunk trajectories
    rollouts/chunk_NNN.jsonl  their texts
    rollouts/settings.json    what sampled them: a different setting samples again (with a warning naming why)

The degeneracy gate (experiments.gate) reads the chunks' texts: under `gate="strict"` the stage refuses after
the first chunk whose trajectories (all chunks so far) fill a template, before the gradients are computed.

`GradSamples` is the sample-side half of `grad_run.Study` (a mixin: it uses the study's config, policy and
stage log).
"""

from __future__ import annotations

import dataclasses
import json
import logging
import os
import shutil
import time

import numpy as np

from dart_jax.analysis.grad_angles import mixed
from dart_jax.experiments import gate as dgate

log = logging.getLogger("dart_jax.experiments.grad_run")


@dataclasses.dataclass
class Group:
    """One query's G trajectories (numpy, as sampled)."""
    uid: str
    ids: np.ndarray
    positions: np.ndarray
    loss_mask: np.ndarray
    scores: np.ndarray
    accuracy: np.ndarray


class GradSamples:
    """Sampling and reading the rollouts of a `Study` (`config`, its section `c`, `checkpoint`, `step`, `out`,
    `policy()`, `_record`)."""

    def settings(self) -> dict:
        from dart_jax.rollout.agent import trajectory_settings
        c = self.c
        return {"model": self.config.model.path, "warm_start": self.config.warm_start,
                "checkpoint": self.checkpoint or "", "step": self.step, "datasets": sorted(c.datasets),
                "limit": int(c.limit) if c.limit else None, "group_size": int(c.group_size),
                "temperature": float(c.temperature), "seed": int(c.seed), "chunk": int(c.chunk),
                "rollout": trajectory_settings(self.config.rollout)}

    def rollout_dir(self) -> str:
        return os.path.join(self.out, "rollouts")

    def _chunks(self) -> list[str]:
        d = self.rollout_dir()
        if not os.path.isdir(d):
            return []
        return sorted(os.path.join(d, f) for f in os.listdir(d)
                      if f.startswith("chunk_") and f.endswith(".npz") and not f.endswith(".tmp.npz"))

    def groups(self) -> list[Group]:
        """Every sampled group, in sampling order."""
        out = []
        for path in self._chunks():
            z = np.load(path, allow_pickle=False)
            g = int(z["group_size"])
            for q, uid in enumerate(z["uids"].tolist()):
                s = slice(q * g, (q + 1) * g)
                out.append(Group(uid, z["ids"][s], z["positions"][s], z["loss_mask"][s], z["scores"][s],
                                 z["accuracy"][s]))
        return out

    def check_gate(self, rows: list[dict] | None = None) -> dict | None:
        """The gate over every sampled trajectory (chunk_NNN.jsonl), questions from the pool (`rows`: already
        loaded); None when the study's gate is off."""
        if self.gate == "off":
            return None
        records = [r for p in self._chunks() for r in dgate.read_records(p[:-len(".npz")] + ".jsonl")]
        return dgate.enforce(dgate.study_gate({"rollouts": records}, self._pool() if rows is None else rows),
                             self.gate, "grad_angles")

    def mixed_groups(self) -> list[Group]:
        return [g for g in self.groups() if mixed(g.accuracy)][:int(self.c.queries)]

    def _pool(self) -> list[dict]:
        from dart_jax.eval.datasets import load_set, resolve
        rows = []
        for s in resolve(list(self.c.datasets), self.config.task):
            r, _ = load_set(s, int(self.c.limit) if self.c.limit else None)
            rows += r
        return rows

    def sample(self) -> dict:
        from dart_jax.rewards.training import make_reward
        from dart_jax.rl import stages as rl_stages
        from dart_jax.rollout.agent import Agent
        from dart_jax.rollout.protocol import PROTOCOLS as TASKS
        from dart_jax.rollout.sampling import SamplingConfig
        from dart_jax.run.held_out import task_accuracy
        from dart_jax.run.policy import run_mesh
        from dart_jax.run.spec import run_spec
        from dart_jax.run.task import build_tool

        c, d = self.c, self.rollout_dir()
        settings_path = os.path.join(d, "settings.json")
        want = self.settings()
        if os.path.isfile(settings_path):
            diffs = self.sample_mismatch()
            if diffs:
                log.warning("grad_angles sample: %s was sampled differently (%s): sampling again (and the gradients "
                            "of the old rollouts are removed)", d, "; ".join(diffs))
                for p in self._chunks():
                    os.remove(p)
                shutil.rmtree(os.path.join(self.out, "grads"), ignore_errors=True)
        os.makedirs(d, exist_ok=True)
        with open(settings_path, "w") as f:
            json.dump(want, f, indent=1)
        rows = self._pool()
        chunks = self._chunks()
        have = len(self.mixed_groups())
        start = len(chunks) * int(c.chunk)
        if have >= int(c.queries) or start >= len(rows):
            log.info("grad_angles sample: done (%d mixed groups of %d queries sampled)", have, start)
            self.check_gate(rows)
            return {"mixed": have, "sampled": min(start, len(rows)), "status": "skipped"}
        pol = self.policy()
        protocol = TASKS[self.config.task]
        spec = run_spec(self.config)
        agent = Agent(pol.cfg, pol.tokenizer, protocol, build_tool(spec, protocol),
                      SamplingConfig(temperature=float(c.temperature)),
                      dataclasses.replace(spec.rollout, route_mode=pol.route_mode),
                      pol.router_convention or spec.router_convention, mesh=run_mesh(spec))
        reward = make_reward(spec.task, spec.reward)
        from tqdm.auto import tqdm
        bar = tqdm(total=int(c.queries), initial=have, desc="mixed groups", unit="query")
        t0 = time.perf_counter()
        k = len(chunks)
        while have < int(c.queries) and start < len(rows):
            part = rows[start:start + int(c.chunk)]
            seed = int(c.seed) * 1_000_003 + k
            ro = rl_stages.rollout(agent, (pol.base, pol.adapters), part, int(c.group_size), seed)
            sc = reward.score(ro.tb.reward_text, ro.metas, ro.tb.observed)
            acc = task_accuracy(self.config.task, ro.tb.reward_text, ro.metas, sc.scores)
            tb = ro.tb
            path = os.path.join(d, f"chunk_{k:03d}.npz")
            with open(os.path.join(d, f"chunk_{k:03d}.jsonl"), "w") as f:
                for i, text in enumerate(tb.response_text):
                    f.write(json.dumps({"uid": str(tb.uids[i]), "score": float(sc.scores[i]),
                                        "accuracy": float(acc[i]), "response": text}, ensure_ascii=False) + "\n")
            np.savez_compressed(path + ".tmp.npz", ids=tb.ids, positions=tb.positions, loss_mask=tb.loss_mask,
                     scores=sc.scores, accuracy=acc, uids=np.asarray([str(r["id"]) for r in part]),
                     group_size=int(c.group_size), seed=seed)
            os.replace(path + ".tmp.npz", path)  # a chunk exists whole or not at all
            new = len(self.mixed_groups())
            bar.update(new - have)
            self._record("sample", f"chunk_{k:03d}", time.perf_counter() - t0, mixed=new - have,
                         trajectories=len(tb.response_text))
            t0 = time.perf_counter()
            have, start, k = new, start + len(part), k + 1
            if self.gate == "strict":
                self.check_gate(rows)
        bar.close()
        if have < int(c.queries):
            log.warning("grad_angles sample: the pool (%d queries) gave %d mixed groups of the %d asked", len(rows),
                        have, int(c.queries))
        self.check_gate(rows)
        return {"mixed": have, "sampled": min(start, len(rows)), "status": "sampled"}

    def sample_mismatch(self) -> list[str]:
        """How the rollouts on disk were sampled differently from this study's settings ([] when alike or
        when nothing was sampled yet)."""
        path = os.path.join(self.rollout_dir(), "settings.json")
        if not os.path.isfile(path):
            return []
        with open(path) as f:
            got = json.load(f)
        want = self.settings()
        return [f"{k}: {got.get(k)!r} → {want[k]!r}" for k in want if got.get(k) != want[k]]
