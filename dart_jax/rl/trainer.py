"""The GRPO loop: sequences the stages of `rl/stages.py` and owns the run's files.

    for step in steps:
        P rows ── stages.rollout (agent: sampler + tool, current policy) ──► Rollouts (P × G)
        stages.score (task reward, accuracy, GRPO advantages by prompt uid) ──► Scored
        Updater.logprobs (old: current policy; reference: adapters off / frozen base)
        Updater (ppo_epochs × mini-batches of the jitted, sharded step) ──► new state, metrics
        metrics (jsonl, TensorBoard, progress bar), rollouts.jsonl, checkpoint every N steps,
        held-out evaluation hooks

Every random choice derives from (seed, step), and the data position is part of the checkpoint, so
a resumed run continues exactly where the interrupted one stood.
"""

from __future__ import annotations

import dataclasses
import logging
import os
import time
from typing import Callable

import jax
import numpy as np

from dart_jax.adapters.method import model_trees
from dart_jax.checkpoints.dart_io import export_dart
from dart_jax.data.readers import question_key
from dart_jax.errors import UserError
from dart_jax.lab.metrics import batch_records, finite, role_skills
from dart_jax.models.transformer import unstack_layers
from dart_jax.parallel.distributed import host_tree, is_main, local_mesh, local_view, on_main
from dart_jax.rewards.training import make_reward
from dart_jax.rl import stages
from dart_jax.rl.optim import make_optimizer
from dart_jax.rl.placement import place_state, state_bytes_per_device
from dart_jax.rollout.agent import Agent
from dart_jax.rollout.protocol import PROTOCOLS, tag_variants
from dart_jax.rollout.tasks import fitting_rows, response_room
from dart_jax.run import host_memory
from dart_jax.run.held_out import rollout_eval
from dart_jax.run.loop import RunLoop, checkpoint_tree
from dart_jax.run.metrics import read_metrics, wilson_interval
from dart_jax.run.policy import load_policy, run_mesh
from dart_jax.run.records import append_rollouts
from dart_jax.run.spec import run_spec
from dart_jax.run.task import build_tool, load_eval_rows, load_task_rows

log = logging.getLogger(__name__)

class DataStream:
    """Epoch-wise shuffled order over the rows; `position` (prompts consumed) is checkpointed."""

    def __init__(self, n: int, seed: int, shuffle: bool = True, position: int = 0):
        self.n, self.seed, self.shuffle, self.position = n, seed, shuffle, position

    def _order(self, epoch: int) -> np.ndarray:
        if not self.shuffle:
            return np.arange(self.n)
        return np.random.default_rng([self.seed, epoch]).permutation(self.n)

    def take(self, k: int) -> list[int]:
        out = []
        for _ in range(k):
            epoch, i = divmod(self.position, self.n)
            out.append(int(self._order(epoch)[i]))
            self.position += 1
        return out


class Trainer:
    def __init__(self, config, on_step: Callable[[int, dict], None] | None = None):
        self.config = config
        self.on_step = on_step
        self.spec = spec = run_spec(config, jax.process_count())  # every setting parsed and checked, once
        if spec.sft is not None:  # run_spec checks a config with an sft section as a warm start's
            raise UserError("launch.train runs GRPO; this config has an sft section (a warm start's config: "
                            "python -m launch.sft)")
        tc = spec.train
        self.method, self.loss_cfg, self.optim_cfg = spec.method, spec.loss, spec.optim
        self.rollout_cfg, self.sampling, self.plan = spec.rollout, spec.sampling, spec.plan
        self.rows = load_task_rows(spec)  # before the model: a missing data file fails fast
        self.mesh = run_mesh(spec)
        key = jax.random.PRNGKey(tc.seed)
        cfg, base, tok, adapters = load_policy(spec, self.mesh, key)
        self.cfg, self.tok = cfg, tok
        self.optimizer = make_optimizer(self.optim_cfg)
        self.state, self.base = place_state(self.method, cfg, base, adapters, self.optimizer, self.mesh)
        del base
        if self.rollout_cfg.decode_layout == "shared" and not self.method.trains_base:
            self.base = unstack_layers(self.base)  # training and rollouts read one per-layer tree
        self.key = jax.random.fold_in(key, 2)

        self.protocol = PROTOCOLS[spec.task]
        self.reward = make_reward(spec.task, spec.reward)
        # multi-process: each process rolls out its share of a step's prompts on its own devices
        self.nproc, self.pid = jax.process_count(), jax.process_index()
        self.local_mesh = local_mesh(self.mesh)
        from dart_jax.serve.rollouts import check_engine, engine_fits
        if self.rollout_cfg.train_engine == "continuous" and not engine_fits(cfg.num_layers, "rollout.train_engine"):
            self.rollout_cfg = dataclasses.replace(self.rollout_cfg, train_engine="batch")  # warned: same trajectories
        self.agent = Agent(cfg, tok, self.protocol, build_tool(spec, self.protocol), self.sampling,
                           self.rollout_cfg, spec.router_convention, mesh=self.local_mesh)
        self.router = self.agent.spec.router
        if self.rollout_cfg.train_engine == "continuous":  # GRPO's rollouts (stages.rollout): refused now, not mid-run
            try:
                check_engine(self.agent, composition=self.method.variant == "2agent", processes=self.nproc,
                             setting="rollout.train_engine")
            except ValueError as e:
                raise UserError(str(e)) from None
        self.answer_tags = (tuple(tag_variants(tok, self.protocol.answer_open)),
                            tuple(tag_variants(tok, self.protocol.answer_close)))
        # training questions whose prompt the context rule refuses never enter the stream (a step cannot be
        # all refused by chance); counted once here. Nothing refused: the stream is the one it always was
        self.rows, self.train_overlong = fitting_rows(tok, spec.task, self.rows, cfg.max_position_embeddings,
                                                      self.rollout_cfg, "training questions")
        if not self.rows:
            raise UserError(f"every training question's prompt leaves less than {response_room(self.rollout_cfg)} "
                            f"response tokens of the model's context ({cfg.max_position_embeddings} positions); "
                            "shorten the prompts or lower rollout.max_tokens_per_turn / rollout.max_response_tokens")
        self.stream = DataStream(len(self.rows), tc.seed, tc.shuffle)
        self.eval_rows = load_eval_rows(spec)
        train_keys = {question_key(r) for r in self.rows}
        leaked = [r["id"] for r in self.eval_rows if question_key(r) in train_keys]
        if leaked:
            raise UserError(f"config.eval.data shares {len(leaked)} questions with config.data.train "
                             f"(e.g. {leaked[:3]}): held-out evaluation must be held out")
        # held-out questions whose prompt the context rule refuses are skipped, counted in eval/skipped_overlong
        self.eval_rows, self.eval_overlong = fitting_rows(tok, spec.task, self.eval_rows, cfg.max_position_embeddings,
                                                          self.rollout_cfg, "held-out questions")
        # held-out questions of another world (the lab's world 1) are searched over their own corpus, by the
        # same kind of retriever: a question is answerable only there
        self.eval_tool = self.agent.tool
        if self.eval_rows and spec.eval.corpus:
            if spec.task != "qa":
                raise UserError(f"eval.corpus={spec.eval.corpus!r} is a retrieval corpus; the {spec.task} task "
                                "has none")
            rc = dataclasses.replace(spec.retriever, corpus=spec.eval.corpus, index_dir="", url="")
            self.eval_tool = build_tool(dataclasses.replace(spec, retriever=rc), self.protocol)
        self.updater = stages.Updater(cfg, self.method, self.loss_cfg, self.optim_cfg, self.plan, self.mesh)

    def rollout_trees(self):
        """(base, adapters) of the current policy in its compute dtypes (the masters stay fp32), on this
        process's devices (parallel.distributed.local_view; the run's mesh with one process)."""
        return local_view(model_trees(self.method, self.state.compute_params(), self.base, None), self.local_mesh)

    # -- one step: the stages, in order ----------------------------------------------------------------
    def train_step(self, step: int) -> dict:
        tc = self.spec.train
        t0 = time.perf_counter()
        rows = [self.rows[i] for i in self.stream.take(tc.prompts_per_step)]
        seed = int(jax.random.randint(jax.random.fold_in(self.key, step), (), 0, 2 ** 31 - 1))
        share = len(rows) // self.nproc  # every process draws the same rows; each rolls out its block
        ro = stages.rollout(self.agent, self.rollout_trees(), rows[self.pid * share:(self.pid + 1) * share],
                            tc.group_size, seed, row_offset=self.pid * share * tc.group_size)
        phases = {f"rollout/{k}": v for k, v in self.agent.take_phases().items()}  # this process's share
        if self.nproc > 1:
            ro = stages.gather_rollouts(ro)
        if ro.overlong.all():  # nothing ran (rollout.tasks.overlong; training rows are filtered at start): a backstop
            raise UserError(f"step {step + 1}: all {len(set(ro.tb.uids))} prompts leave less than "
                            f"{response_room(self.rollout_cfg)} response tokens of the model's context "
                            f"({self.cfg.max_position_embeddings} positions); shorten the prompts or lower "
                            "rollout.max_tokens_per_turn / rollout.max_response_tokens")
        release_s = self._release()
        t1 = time.perf_counter()
        sc = stages.score(ro, self.reward, self.method, self.router, tc.pad_multiple, self.spec.norm_adv_by_std,
                          self.answer_tags)
        if self.spec.output.save_rollouts and is_main():
            append_rollouts(self.spec.output.dir, step + 1, ro.tb, ro.rows, sc.scores, sc.accuracy, sc.valid,
                            self.protocol.name, self.tok)
        sc.batch["old_logp"], sc.batch["ref_logp"] = self.updater.logprobs(self.state, self.base, sc.batch)
        t2 = time.perf_counter()
        self.state, upd = self.updater(self.state, self.base, sc.batch, step,
                                       jax.random.fold_in(self.key, 10_000 + step))
        release_s += self._release()
        t3 = time.perf_counter()
        m = stages.step_metrics(ro, sc, upd, self.protocol.name, bool(self.loss_cfg.kl_coef),
                                self.updater.plan.old_logp == "recompute",
                                {"rollout": t1 - t0, "score": t2 - t1, "update": t3 - t2})
        m.update(phases)
        m["rollout/train_questions_overlong"] = float(self.train_overlong)  # left out at start (context rule)
        if any(r.get("lab") for r in ro.rows):  # the lab's questions: tool and reasoning skills apart (lab.metrics)
            m.update(finite(role_skills(batch_records(ro.tb, ro.rows), ro.rows)))
        m["time/release_s"] = release_s  # inside rollout_s and update_s: the calls alone, not re-faulting pages
        m.update(memory_metrics(self.state, self.base))
        return m

    def _release(self) -> float:
        """Between stages: hand the C allocator's free pages back (run.host_memory), so that resident
        memory follows what the next stage holds instead of every stage's high-water mark. Returns the
        seconds the call took (0 when `train.release_host_memory` is off)."""
        if not self.spec.train.release_host_memory:
            return 0.0
        t = time.perf_counter()
        host_memory.release()
        return time.perf_counter() - t

    def evaluate(self) -> dict:
        """Greedy (eval.temperature) rollouts of the held-out questions with the current policy."""
        t = time.perf_counter()
        base, ads = self.rollout_trees()
        res = rollout_eval(self.cfg, self.tok, self.protocol, self.eval_tool, self.rollout_cfg,
                           self.spec.router_convention, base, ads, self.eval_rows,
                           float(self.spec.eval.temperature),
                           self.spec.eval.batch or max(self.spec.train.micro_batch, 8),
                           reward=self.reward, mesh=self.local_mesh)
        out = {f"eval/{k}": v for k, v in res.items() if k != "example"}
        out["eval/temperature"] = float(self.spec.eval.temperature)
        out["eval/skipped_overlong"] = float(self.eval_overlong)
        out["time/eval_s"] = time.perf_counter() - t
        return out

    # -- the loop: files, checkpoints, hooks -----------------------------------------------------------
    def _train_tree(self):
        """What a checkpoint holds (run.loop.checkpoint_tree): the RNG key replicated on the run's mesh."""
        return checkpoint_tree(self.state, self.key, self.mesh)

    def run(self, resume: bool = False, overwrite: bool = False, allow_change=()) -> dict:
        """Train to `train.steps`. A fresh run refuses an output.dir that holds a run unless `overwrite`;
        `resume` continues from the newest usable checkpoint or fails saying why, refusing changed settings
        that `allow_change` does not name (`run.loop`)."""
        oc, tc = self.spec.output, self.spec.train
        loop = RunLoop(self.config, tc.steps, "GRPO", resume, overwrite, self.mesh, allow_change)
        self.state, self.key, meta = loop.restore(self.state, self.key)
        if resume:
            self.stream.position = int(meta["data_position"])
            log.info("resumed from checkpoint %d (data position %d)", loop.start, self.stream.position)
        loop.begin()
        history = []
        if self.eval_rows and loop.start == 0:  # phase lines before the bar: a log line would break it
            log.info("step 0: the starting policy on %d held-out questions (eval.temperature %g; the sampler "
                     "compiles on first use)", len(self.eval_rows), float(self.spec.eval.temperature))
        if loop.start < tc.steps:
            log.info("steps %d-%d: each rolls out %d prompts × %d samples, scores them, then updates; the first "
                     "step compiles the rollout and the update programs", loop.start + 1, tc.steps,
                     tc.prompts_per_step, tc.group_size)
        every = self.spec.eval.every  # plus the first (step 0) and the last step
        if self.eval_rows and loop.start == 0:
            loop.write(0, self.evaluate())  # the starting policy, before any update
        for step in loop.steps():
            metrics = self.train_step(step)
            if self.eval_rows and ((every and (step + 1) % every == 0) or step + 1 == tc.steps):
                metrics.update(self.evaluate())
            loop.write(step + 1, metrics, reward=f"{metrics['reward/mean']:.3f}",
                       answer=f"{metrics['protocol/answer_rate']:.2f}", kl=f"{metrics.get('actor/kl', 0.0):.2e}",
                       s=f"{metrics['time/step_s']:.0f}")
            history.append(metrics)
            if self.on_step is not None:
                self.on_step(step + 1, metrics)
            loop.checkpoint(step + 1, self.state, self.key, {"data_position": self.stream.position})
        out = {**loop.close("reward_curve.png"), "steps": tc.steps, "history": history}
        if oc.export_adapters and self.method.variant == "dart":
            out["adapters"] = self.export(os.path.join(oc.dir, "adapters"))
        return out

    def export(self, out_dir: str) -> str:
        """The DART adapters as a directory a later run loads (`init_from`); collective: arrays split
        across processes come to every host, process 0 writes the files."""
        tables = host_tree({k: self.base[k] for k in ("embed", "lm_head") if k in self.base})
        return on_main(export_dart, out_dir, host_tree(self.state.compute_params()), self.cfg, tables,
                       self.tok, self.protocol.tool_open, self.protocol.tool_close,
                       self.router.convention, base_model=self.spec.model.path,
                       extra={"kind": "dart", "warm_start": self.spec.warm_start})


def memory_metrics(state, base) -> dict:
    """What the run holds: one device's share of the train state (fp32 masters + optimiser moments)
    and of the frozen base, read from the live arrays; the process's peak and current resident memory
    and the C allocator's in-use / free bytes (host RAM, on CPU the devices' memory too:
    run.host_memory) and, where the backend reports it, the device's peak allocation."""
    shard = lambda tree: sum(max(s.data.nbytes for s in x.addressable_shards)  # noqa: E731
                             for x in jax.tree.leaves(tree) if hasattr(x, "addressable_shards"))
    out = {"memory/train_state_mib": state_bytes_per_device(state) / 2 ** 20, "memory/base_mib": shard(base) / 2 ** 20,
           **host_memory.stats()}
    stats = jax.local_devices()[0].memory_stats() or {}
    if "peak_bytes_in_use" in stats:
        out["memory/device_peak_mib"] = stats["peak_bytes_in_use"] / 2 ** 20
    return out


def held_out_line(a: dict, b: dict) -> str:
    """First vs last held-out evaluation as counts with 95% Wilson intervals; "greedy" only at T = 0."""
    temp = float(a.get("eval/temperature", 0.0))
    mode = "greedy" if temp == 0.0 else f"sampled at T={temp:g}"

    def one(r):
        n = int(r.get("eval/scored", r["eval/n"]))
        if "eval/correct" not in r:
            return f"step {r['step']}: reward {r['eval/reward']:.3f}, answers {r['eval/answer_rate']:.2f}"
        k = int(r["eval/correct"])
        lo, hi = wilson_interval(k, n)
        return (f"step {r['step']}: {k}/{n} correct (95% CI {lo:.2f}–{hi:.2f}), answers "
                f"{r['eval/answer_rate']:.2f}")

    return f"held-out ({int(a['eval/n'])} questions, {mode})  {one(a)}   {one(b)}"


def summary(result: dict) -> str:
    evals = [r for r in read_metrics(result["metrics"]) if "eval/reward" in r]
    rows = [r for r in read_metrics(result["metrics"]) if "reward/mean" in r]
    if not rows:
        return "no steps recorded"
    k = max(1, len(rows) // 3)
    first, last = rows[:k], rows[-k:]

    def avg(rs, key):
        vals = [r[key] for r in rs if key in r]
        return sum(vals) / len(vals) if vals else float("nan")

    lines = [f"steps {rows[0]['step']}–{rows[-1]['step']}",
             f"mean reward        first {k}: {avg(first, 'reward/mean'):+.3f}   last {k}: "
             f"{avg(last, 'reward/mean'):+.3f}",
             f"protocol answers   first {k}: {avg(first, 'protocol/answer_rate'):.2f}    last {k}: "
             f"{avg(last, 'protocol/answer_rate'):.2f}",
             f"tool calls / traj  first {k}: {avg(first, 'rollout/tool_calls'):.2f}    last {k}: "
             f"{avg(last, 'rollout/tool_calls'):.2f}",
             f"protocol-following rollouts (ended in an answer), all steps: {avg(rows, 'protocol/answer_rate'):.0%}",
             f"metrics {result['metrics']}", f"plot {result['plot']}", f"checkpoints {result['checkpoints']}"]
    if len(evals) >= 2:
        lines.insert(4, held_out_line(evals[0], evals[-1]))
    if "adapters" in result:
        lines.append(f"adapters {result['adapters']}")
    if all(r.get("protocol/answer_rate", 0) == 0 for r in rows):
        lines.append("note: no rollout reached an <answer>/<solution>: every reward is equal, so every GRPO "
                     "advantage is 0 and only the KL/entropy terms act. Small models need a protocol warm "
                     "start first (WORKSPACE.md, 'Known gaps').")
    return "\n".join(lines)

