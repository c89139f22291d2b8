"""The GRPO trainer loop: prompts -> rollout -> rewards -> advantages -> mini-batch updates -> metrics.

    for step in steps:
        P prompts × G samples ── Agent.rollout (sampler + tools, current policy) ──► trajectories
        rewards (EM / SQL execution) ► GRPO advantages by prompt uid
        old log-probs (current policy) and reference log-probs (adapters off / frozen base)
        ppo_epochs × mini-batches ► jitted, sharded train step (micro-batch accumulation)
        metrics (jsonl, TensorBoard, progress bar) ► checkpoint every N steps

Every random choice derives from (seed, step), and the data position is part of the checkpoint, so
a resumed run continues exactly where the interrupted one stood.
"""

from __future__ import annotations

import json
import logging
import math
import os
import time
from typing import Any, Callable

import jax
import jax.numpy as jnp
import numpy as np

from dart_jax.adapters.method import model_trees
from dart_jax.checkpoints.dart_io import export_dart
from dart_jax.data.readers import load_rows, merge, question_key
from dart_jax.rewards.training import make_reward
from dart_jax.rl import batch as batch_lib
from dart_jax.rl import run_dir
from dart_jax.rl.checkpoint import Checkpointer, checkpoint_steps
from dart_jax.rl.evaluate import rollout_eval, task_accuracy
from dart_jax.rl.metrics import MetricsWriter, plot_curves
from dart_jax.rl.optim import make_optimizer
from dart_jax.rl.placement import jit_step, microbatch_sharding, place_state
from dart_jax.rl.policy import load_policy, repo_path, run_mesh
from dart_jax.rl.sections import loss_config, method_spec, optim_config, reward_config, section
from dart_jax.rl.step import BATCH_KEYS, make_scorer, make_train_step
from dart_jax.rollout.agent import Agent, RolloutConfig, tool_for
from dart_jax.rollout.protocol import PROTOCOLS
from dart_jax.rollout.router import REASONING, TOOL
from dart_jax.rollout.sampling import SamplingConfig
from dart_jax.rollout.tasks import DATA, qa_task, sql_task

log = logging.getLogger(__name__)

ROUTE_MODE = {"dart": "role", "lora": "shared", "full": "none"}


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


def build_tool(config, protocol):
    """The agent's tool function for `protocol` as `config` says."""
    return tool_for(protocol, make_tool(config, protocol))


def make_tool(config, protocol):
    """The raw tool: a SQLiteTool, or a RetrievalTool over the local index / a retrieval server."""
    if protocol.name == "sql":
        from dart_jax.tools.sqlite_exec import SQLiteTool
        return SQLiteTool(timeout_s=float(config.tool.sql_timeout_s))
    from dart_jax.tools.retrieval import RetrievalTool, Retriever, ensure_index
    rc = config.retriever
    if rc.url:
        from dart_jax.tools.retrieval_server import RemoteRetriever
        searcher = RemoteRetriever(rc.url)
    else:
        index = rc.index_dir or ensure_index(repo_path(rc.corpus), rc.encoder)
        searcher = Retriever(index)
    return RetrievalTool(searcher, topk=int(rc.topk))


def load_eval_rows(config) -> list[dict]:
    """The fixed held-out questions of `config.eval` (none when eval.n is 0)."""
    ec = config.get("eval")
    if not ec or not ec.n or not ec.data:
        return []
    rows = merge(*[load_rows(dict(spec), base_dir=os.path.dirname(DATA)) for spec in ec.data])
    return rows[:int(ec.n)]


def load_task_rows(config) -> list[dict]:
    if not config.data.train:
        raise ValueError("config.data.train is empty: list the training datasets (see configs/base.py)")
    sets = [load_rows(dict(spec), base_dir=os.path.dirname(DATA)) for spec in config.data.train]
    rows = merge(*sets)
    if not rows:
        raise ValueError("config.data.train selected no rows")
    return rows


class Trainer:
    def __init__(self, config, on_step: Callable[[int, dict], None] | None = None):
        self.config = config
        self.on_step = on_step
        tc = config.train
        self.method = method_spec(config)
        self.loss_cfg = loss_config(config)
        self.optim_cfg = optim_config(config)
        self.rollout_cfg = RolloutConfig(**section(config, "rollout"), route_mode=ROUTE_MODE[self.method.variant])
        self.sampling = SamplingConfig(**section(config, "sampling"))
        if tc.get("old_logp", "recompute") not in ("recompute", "sampler"):
            raise ValueError(f"train.old_logp={tc.old_logp!r}; expected 'recompute' or 'sampler'")
        if tc.get("old_logp") == "sampler" and self.sampling.temperature != self.loss_cfg.temperature:
            raise ValueError(f"train.old_logp='sampler' needs sampling.temperature ({self.sampling.temperature}) "
                             f"== loss.temperature ({self.loss_cfg.temperature}): the sampler records log-probs "
                             "at its own temperature")
        n_traj = tc.prompts_per_step * tc.group_size
        if n_traj % tc.mini_batch or tc.mini_batch % tc.micro_batch:
            raise ValueError(f"train.prompts_per_step × train.group_size = {n_traj} must be a multiple of "
                             f"train.mini_batch ({tc.mini_batch}), itself a multiple of train.micro_batch "
                             f"({tc.micro_batch})")
        self.rows = load_task_rows(config)  # before the model: a missing data file fails fast
        self.mesh = run_mesh(config)
        key = jax.random.PRNGKey(tc.seed)
        cfg, base, tok, adapters = load_policy(config, self.method, self.mesh, key)
        self.cfg, self.tok = cfg, tok
        self.optimizer = make_optimizer(self.optim_cfg)
        self.state, self.base = place_state(self.method, cfg, base, adapters, self.optimizer, self.mesh)
        self.key = jax.random.fold_in(key, 2)

        self.protocol = PROTOCOLS[config.task]
        self.reward = make_reward(config.task, reward_config(config))
        self.agent = Agent(cfg, tok, self.protocol, build_tool(config, self.protocol), self.sampling,
                           self.rollout_cfg, config.router.convention)
        self.router = self.agent.spec.router
        self.stream = DataStream(len(self.rows), tc.seed, tc.shuffle)
        self.eval_rows = load_eval_rows(config)
        train_keys = {question_key(r) for r in self.rows}
        leaked = [r["id"] for r in self.eval_rows if question_key(r) in train_keys]
        if leaked:
            raise ValueError(f"config.eval.data shares {len(leaked)} questions with config.data.train "
                             f"(e.g. {leaked[:3]}): held-out evaluation must be held out")
        self._compile()

    # -- jitted functions with explicit shardings ----------------------------------------------
    def _compile(self):
        self.state_sh = jax.tree.map(lambda x: x.sharding, self.state)
        step = make_train_step(self.cfg, self.method, self.loss_cfg, self.optim_cfg)
        self._step_jits: dict = {}

        def step_for(batch):
            shapes = {k: batch[k].shape for k in BATCH_KEYS}
            key = tuple(shapes.items())
            if key not in self._step_jits:  # one per padded length: bounded by pad_multiple
                self._step_jits[key] = jit_step(step, self.state, self.base, shapes, self.mesh)
            return self._step_jits[key]

        self._step_for = step_for
        score = make_scorer(self.cfg, self.loss_cfg.temperature, self.loss_cfg.logprob_chunk)
        method = self.method

        def old_logp(params, base, tokens, positions, routes):
            b, a = model_trees(method, params, base, None)
            return score(b, a, tokens, positions, routes)

        def ref_logp(base, tokens, positions):
            return score(base, None, tokens, positions, None)

        self._old = jax.jit(old_logp)
        self._ref = jax.jit(ref_logp)

    def rollout_trees(self):
        """(base, adapters) of the current policy in its compute dtypes (the masters stay fp32)."""
        return model_trees(self.method, self.state.compute_params(), self.base, None)

    # -- one step --------------------------------------------------------------------------------
    def _score(self, batch: dict) -> tuple[np.ndarray, np.ndarray]:
        """(old, reference) log-probs. old: recomputed teacher-forced (verl) or, with
        train.old_logp="sampler", the log-probs the sampler recorded while drawing the tokens — the
        same quantity (log softmax(logits / T) of the unfiltered distribution, tested to ~1e-5)
        without a second forward pass. reference: adapters off / frozen base, only when kl_coef ≠ 0."""
        mb = self.config.train.micro_batch
        n = batch["tokens"].shape[0]
        recompute = self.config.train.get("old_logp", "recompute") == "recompute"
        olds, refs = [], []
        for s in range(0, n, mb):
            t, p, r = (jnp.asarray(batch[k][s:s + mb]) for k in ("tokens", "positions", "route_ids"))
            if recompute:
                olds.append(np.asarray(self._old(self.state.compute_params(), self.base, t, p, r)))
            if self.loss_cfg.kl_coef != 0:
                refs.append(np.asarray(self._ref(self.base, t, p)))
        old = np.concatenate(olds) if recompute else batch["sampler_logp"]
        return old, (np.concatenate(refs) if refs else old)


    def train_step(self, step: int) -> dict:
        tc = self.config.train
        t0 = time.perf_counter()
        picks = [self.rows[i] for i in self.stream.take(tc.prompts_per_step)]
        prompts, uids, metas = self.task_fn(self.tok, picks)
        g = tc.group_size
        prompts, uids = [p for p in prompts for _ in range(g)], [u for u in uids for _ in range(g)]
        metas = [dict(m, data_source=r.get("data_source", "data")) for m, r in zip(metas, picks) for _ in range(g)]
        rollout_base, rollout_ads = self.rollout_trees()
        seed = int(jax.random.randint(jax.random.fold_in(self.key, step), (), 0, 2 ** 31 - 1))
        tb = self.agent.rollout(rollout_base, rollout_ads, prompts, uids, metas, seed=seed)
        t_roll = time.perf_counter()
        scored = self.reward.score(tb.response_text, metas)
        scores, valid = scored.scores, scored.valid
        acc = task_accuracy(self.protocol.name, tb.response_text, metas, scores)
        if self.config.output.get("save_rollouts", False):
            self._save_rollouts(step, tb, [r for r in picks for _ in range(g)], scores, acc, valid)
        batch = batch_lib.build_batch(tb, scores, self.method, self.router, tc.pad_multiple,
                                      self.config.algo.norm_adv_by_std, valid)
        batch["old_logp"], batch["ref_logp"] = self._score(batch)
        t_score = time.perf_counter()
        upd: list[dict] = []
        key = jax.random.fold_in(self.key, 10_000 + step)
        for epoch in range(tc.ppo_epochs):
            order = np.arange(len(prompts))
            if tc.shuffle_minibatches:
                order = np.random.default_rng([tc.seed, step, epoch]).permutation(len(prompts))
            for k, mb in enumerate(batch_lib.minibatches(batch, order, tc.mini_batch, tc.micro_batch, BATCH_KEYS)):
                mb = {name: jax.device_put(v, microbatch_sharding(v.shape, self.mesh)) for name, v in mb.items()}
                self.state, m = self._step_for(mb)(self.state, self.base, mb, jax.random.fold_in(key, epoch * 1000 + k),
                                                   np.int32(step))
                upd.append(jax.device_get(m))
        t_end = time.perf_counter()
        return self._metrics(step, tb, batch, scored, acc, metas, upd, t0, t_roll, t_score, t_end)

    def evaluate(self) -> dict:
        """Greedy (eval.temperature) rollouts of the held-out questions with the current policy."""
        base, ads = self.rollout_trees()
        res = rollout_eval(self.cfg, self.tok, self.protocol, self.agent.tool, self.rollout_cfg,
                           self.config.router.convention, base, ads, self.eval_rows,
                           float(self.config.eval.temperature), max(self.config.train.micro_batch, 8),
                           reward=self.reward)
        out = {f"eval/{k}": v for k, v in res.items() if k != "example"}
        out["eval/temperature"] = float(self.config.eval.temperature)
        return out

    def _trim_rollouts(self, start: int) -> None:
        """After a successful resume: keep only trajectories of steps ≤ start (drop what the interrupted
        run wrote past its checkpoint)."""
        path = os.path.join(self.config.output.dir, "rollouts.jsonl")
        if not os.path.isfile(path):
            return
        with open(path) as f:
            keep = [line for line in f if line.strip() and json.loads(line)["step"] <= start]
        with open(path, "w") as f:
            f.writelines(keep)

    def _save_rollouts(self, step: int, tb, rows: list[dict], scores: np.ndarray, acc: np.ndarray,
                       valid: np.ndarray) -> None:
        """Append every trajectory of the step to output.dir/rollouts.jsonl as text pieces (written: loss
        1, observations: 0) — the input of self-distillation (`sft.demos.distill_demos`)."""
        os.makedirs(self.config.output.dir, exist_ok=True)
        with open(os.path.join(self.config.output.dir, "rollouts.jsonl"), "a") as f:
            for i, row in enumerate(rows):
                p, n = int(tb.prompt_len[i]), int(tb.length[i])
                ids, mask = tb.ids[i, p:n].tolist(), tb.loss_mask[i, p:n]
                pieces, start = [], 0
                for t in range(1, len(ids) + 1):
                    if t == len(ids) or mask[t] != mask[start]:
                        pieces.append({"text": self.tok.decode(ids[start:t], skip_special_tokens=False),
                                       "loss": int(mask[start] > 0)})
                        start = t
                rec = {"step": step + 1, "uid": tb.uids[i], "data_source": row.get("data_source", "data"),
                       "task": self.protocol.name, "question": row["question"], "pieces": pieces,
                       "score": float(scores[i]), "accuracy": float(acc[i]), "finish": tb.finish_reason[i],
                       "in_update": bool(valid[i])}
                for k in ("golden_answers", "db_path", "db_id", "query"):
                    if k in row:
                        rec[k] = row[k]
                f.write(json.dumps(rec, ensure_ascii=False) + "\n")

    def _metrics(self, step, tb, batch, scored, acc, metas, upd, t0, t_roll, t_score, t_end) -> dict:
        m: dict[str, Any] = {}
        ok = scored.valid  # rows whose reference works (a failing gold query drops its prompt)
        scores = scored.scores
        mean = lambda x: float(x.mean()) if x.size else float("nan")  # noqa: E731
        m["reward/mean"] = mean(scores[ok])
        m["reward/std"] = float(scores[ok].std()) if ok.any() else float("nan")
        m["reward/min"] = float(scores[ok].min()) if ok.any() else float("nan")
        m["reward/max"] = float(scores[ok].max()) if ok.any() else float("nan")
        m["accuracy/mean"] = mean(acc[ok])
        m["reward/dropped_prompts"] = float(len({tb.uids[i] for i in np.flatnonzero(~ok)}))
        for k, v in scored.counts.items():
            m[f"reward/{self.protocol.name}_{k}"] = float(v)
        for src in sorted({x["data_source"] for x in metas}):
            idx = np.asarray([i for i, x in enumerate(metas) if x["data_source"] == src and ok[i]], int)
            m[f"reward/{src}"] = mean(scores[idx])
            m[f"accuracy/{src}"] = mean(acc[idx])
        finish = np.asarray(tb.finish_reason)
        m["protocol/answer_rate"] = float(np.mean(finish == "answer"))
        for reason in ("invalid", "length", "budget"):
            m[f"protocol/finish_{reason}"] = float(np.mean(finish == reason))
        m["rollout/tool_calls"] = float(tb.tool_calls().mean())
        m["rollout/turns"] = float(np.mean([len(t) for t in tb.turns]))
        m["rollout/response_tokens"] = float(np.mean(tb.length - tb.prompt_len))
        m["rollout/sampled_tokens"] = float(tb.loss_mask.sum(-1).mean())
        mask = batch["loss_mask"]
        m["tokens/reasoning"] = float(np.sum(mask * (batch["loss_roles"] == REASONING)))
        m["tokens/tool"] = float(np.sum(mask * (batch["loss_roles"] == TOOL)))
        if self.config.train.get("old_logp", "recompute") == "recompute":  # else old_logp *is* the sampler's
            sampled = np.pad(tb.loss_mask, ((0, 0), (0, mask.shape[1] - tb.loss_mask.shape[1]))) > 0
            gap = np.abs(batch["sampler_logp"] - batch["old_logp"])[sampled]
            m["rollout/logprob_gap_mean"] = float(gap.mean()) if gap.size else 0.0
            m["rollout/logprob_gap_max"] = float(gap.max()) if gap.size else 0.0
        m["advantage/abs_mean"] = float(np.abs(batch["advantages"]).mean())
        keys = ("loss", "pg_loss", "kl", "entropy", "pg_clipfrac", "pg_clipfrac_lower", "ppo_kl", "grad_norm")
        for k in keys if self.loss_cfg.kl_coef else tuple(k for k in keys if k != "kl"):  # no reference, no KL
            vals = [float(u[k]) for u in upd if math.isfinite(float(u[k]))]
            m[f"actor/{k}"] = float(np.mean(vals)) if vals else float("nan")
        m["actor/skipped_updates"] = float(sum(float(u["skipped"]) for u in upd))
        m["actor/lr"] = float(upd[-1]["lr"])  # every update of one RL step shares it (verl's clock)
        total_tokens = float(np.sum(batch["positions"] >= 0))
        m["time/rollout_s"] = t_roll - t0
        m["time/score_s"] = t_score - t_roll
        m["time/update_s"] = t_end - t_score
        m["time/step_s"] = t_end - t0
        m["throughput/tokens_per_s"] = total_tokens / max(t_end - t0, 1e-9)
        m["rollout/generated_tokens_per_s"] = float(tb.loss_mask.sum()) / max(t_roll - t0, 1e-9)
        return m

    # -- the loop --------------------------------------------------------------------------------
    @property
    def task_fn(self):
        return qa_task if self.protocol.name == "qa" else sql_task

    def _train_tree(self):
        return {"train": self.state, "rng": self.key}

    def run(self, resume: bool = False, overwrite: bool = False) -> dict:
        """Train to `train.steps`. A fresh run refuses an output.dir that holds a run unless `overwrite`;
        `resume` continues from the newest usable checkpoint or fails saying why (`run_dir`)."""
        from tqdm.auto import tqdm

        oc, tc = self.config.output, self.config.train
        os.makedirs(oc.dir, exist_ok=True)
        ckdir = os.path.join(oc.dir, "checkpoints")
        if not resume:
            run_dir.start_fresh(oc.dir, self.config, checkpoint_steps(ckdir), overwrite)
        ckpt = Checkpointer(ckdir, keep=oc.keep)
        start = 0
        if resume:
            got = ckpt.restore_latest(self._train_tree())
            if got is None:
                ckpt.close()
                raise run_dir.resume_failure(oc.dir, self.config, ckpt.failures)
            start, tree, meta = got
            self.state = jax.device_put(tree["train"], self.state_sh)
            self.key = tree["rng"]
            self.stream.position = int(meta["data_position"])
            log.info("resumed from checkpoint %d (data position %d)", start, self.stream.position)
            for diff in run_dir.resumed_differences(oc.dir, self.config):
                log.warning("resumed with a changed setting: %s", diff)
            self._trim_rollouts(start)
        writer = MetricsWriter(oc.dir, resume_step=start if resume else None, tensorboard=oc.tensorboard)
        history = []
        bar = tqdm(range(start, tc.steps), initial=start, total=tc.steps, desc="GRPO", unit="step",
                   disable=not oc.progress)
        every = int(self.config.eval.every)  # plus the first (step 0) and the last step
        if self.eval_rows and start == 0:
            writer.write(0, self.evaluate())  # the starting policy, before any update
        for step in bar:
            metrics = self.train_step(step)
            if self.eval_rows and ((every and (step + 1) % every == 0) or step + 1 == tc.steps):
                metrics.update(self.evaluate())
            writer.write(step + 1, metrics)
            history.append(metrics)
            bar.set_postfix(reward=f"{metrics['reward/mean']:.3f}", answer=f"{metrics['protocol/answer_rate']:.2f}",
                            kl=f"{metrics.get('actor/kl', 0.0):.2e}", s=f"{metrics['time/step_s']:.0f}")
            if self.on_step is not None:
                self.on_step(step + 1, metrics)
            if (step + 1) % oc.checkpoint_every == 0 or step + 1 == tc.steps:
                ckpt.save(step + 1, self._train_tree(), {"data_position": self.stream.position, "step": step + 1})
        writer.close()
        ckpt.close()
        plot = plot_curves(writer.path, os.path.join(oc.dir, "reward_curve.png"))
        out = {"metrics": writer.path, "plot": plot, "checkpoints": ckpt.directory, "steps": tc.steps,
               "history": history}
        if oc.export_adapters and self.method.variant == "dart":
            out["adapters"] = export_dart(os.path.join(oc.dir, "adapters"), self.state.compute_params(), self.cfg, self.base,
                                          self.tok, self.protocol.tool_open, self.protocol.tool_close,
                                          self.router.convention, base_model=self.config.model.path,
                                          extra={"kind": "dart", "warm_start": self.config.get("warm_start", "")})
        return out


def held_out_line(a: dict, b: dict) -> str:
    """First vs last held-out evaluation as counts with 95% Wilson intervals; "greedy" only at T = 0."""
    from dart_jax.rl.metrics import wilson_interval
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
    from dart_jax.rl.metrics import read_metrics
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
             f"mean reward        first {k}: {avg(first, 'reward/mean'):+.3f}   last {k}: {avg(last, 'reward/mean'):+.3f}",
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

