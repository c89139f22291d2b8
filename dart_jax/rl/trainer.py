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
from dart_jax.rewards.qa import em_reward
from dart_jax.rl import batch as batch_lib
from dart_jax.rl.checkpoint import Checkpointer
from dart_jax.rl.evaluate import rollout_eval
from dart_jax.rl.metrics import MetricsWriter, plot_curves
from dart_jax.rl.optim import learning_rate, make_optimizer
from dart_jax.rl.placement import jit_step, microbatch_sharding, place_state
from dart_jax.rl.policy import load_policy, repo_path, run_mesh
from dart_jax.rl.sections import loss_config, method_spec, optim_config, section
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
    sets = [load_rows(dict(spec), base_dir=os.path.dirname(DATA)) for spec in config.data.train]
    rows = merge(*sets)
    if not rows:
        raise ValueError("config.data.train selected no rows")
    return rows


def task_accuracy(task: str, texts: list[str], metas: list[dict], scores: np.ndarray) -> np.ndarray:
    """Per-trajectory accuracy, whatever the reward shaping: QA = EM of the response's last
    <answer> (Search-R1), SQL = execution match (SkyRL's reward is +1 exactly then)."""
    if task == "qa":
        return np.asarray([em_reward(t, m["golden_answers"]) for t, m in zip(texts, metas)], np.float32)
    return (np.asarray(scores) > 0).astype(np.float32)


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
        self.mesh = run_mesh(config)
        key = jax.random.PRNGKey(tc.seed)
        cfg, base, tok, adapters = load_policy(config, self.method, self.mesh, key)
        self.cfg, self.tok = cfg, tok
        self.optimizer = make_optimizer(self.optim_cfg)
        self.state, self.base = place_state(self.method, cfg, base, adapters, self.optimizer, self.mesh)
        self.key = jax.random.fold_in(key, 2)

        self.protocol = PROTOCOLS[config.task]
        self.rows = load_task_rows(config)
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
        step = make_train_step(self.cfg, self.method, self.loss_cfg, self.optimizer)
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
        return model_trees(self.method, self.state.params, self.base, None)

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
                olds.append(np.asarray(self._old(self.state.params, self.base, t, p, r)))
            if self.loss_cfg.kl_coef != 0:
                refs.append(np.asarray(self._ref(self.base, t, p)))
        old = np.concatenate(olds) if recompute else batch["sampler_logp"]
        return old, (np.concatenate(refs) if refs else old)

    def _rewards(self, tb, metas) -> tuple[np.ndarray, np.ndarray]:
        scores = np.asarray([self.reward_fn(tb.response_text[i], metas[i]) for i in range(tb.batch_size)], np.float32)
        return scores, task_accuracy(self.protocol.name, tb.response_text, metas, scores)

    def train_step(self, step: int) -> dict:
        tc = self.config.train
        t0 = time.perf_counter()
        picks = [self.rows[i] for i in self.stream.take(tc.prompts_per_step)]
        prompts, uids, metas, self.reward_fn = self.task_fn(self.tok, picks)
        g = tc.group_size
        prompts, uids = [p for p in prompts for _ in range(g)], [u for u in uids for _ in range(g)]
        metas = [dict(m, data_source=r.get("data_source", "data")) for m, r in zip(metas, picks) for _ in range(g)]
        rollout_base, rollout_ads = self.rollout_trees()
        seed = int(jax.random.randint(jax.random.fold_in(self.key, step), (), 0, 2 ** 31 - 1))
        tb = self.agent.rollout(rollout_base, rollout_ads, prompts, uids, metas, seed=seed)
        t_roll = time.perf_counter()
        scores, acc = self._rewards(tb, metas)
        if self.config.output.get("save_rollouts", False):
            self._save_rollouts(step, tb, [r for r in picks for _ in range(g)], scores, acc)
        batch = batch_lib.build_batch(tb, scores, self.method, self.router, tc.pad_multiple,
                                      self.config.algo.norm_adv_by_std)
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
                self.state, m = self._step_for(mb)(self.state, self.base, mb, jax.random.fold_in(key, epoch * 1000 + k))
                upd.append(jax.device_get(m))
        t_end = time.perf_counter()
        return self._metrics(step, tb, batch, scores, acc, metas, upd, t0, t_roll, t_score, t_end)

    def evaluate(self) -> dict:
        """Greedy (eval.temperature) rollouts of the held-out questions with the current policy."""
        base, ads = self.rollout_trees()
        res = rollout_eval(self.cfg, self.tok, self.protocol, self.agent.tool, self.rollout_cfg,
                           self.config.router.convention, base, ads, self.eval_rows,
                           float(self.config.eval.temperature), max(self.config.train.micro_batch, 8))
        return {f"eval/{k}": v for k, v in res.items() if k != "example"}

    def _trim_rollouts(self, start: int) -> None:
        """Keep only trajectories of steps ≤ start (a fresh run starts an empty file; a resumed run drops
        what the interrupted run wrote past its checkpoint)."""
        path = os.path.join(self.config.output.dir, "rollouts.jsonl")
        if not os.path.isfile(path):
            return
        with open(path) as f:
            keep = [line for line in f if line.strip() and json.loads(line)["step"] <= start]
        with open(path, "w") as f:
            f.writelines(keep)

    def _save_rollouts(self, step: int, tb, rows: list[dict], scores: np.ndarray, acc: np.ndarray) -> None:
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
                       "score": float(scores[i]), "accuracy": float(acc[i]), "finish": tb.finish_reason[i]}
                for k in ("golden_answers", "db_path", "db_id", "query"):
                    if k in row:
                        rec[k] = row[k]
                f.write(json.dumps(rec, ensure_ascii=False) + "\n")

    def _metrics(self, step, tb, batch, scores, acc, metas, upd, t0, t_roll, t_score, t_end) -> dict:
        m: dict[str, Any] = {}
        m["reward/mean"] = float(scores.mean())
        m["reward/std"] = float(scores.std())
        m["accuracy/mean"] = float(acc.mean())
        for src in sorted({x["data_source"] for x in metas}):
            idx = [i for i, x in enumerate(metas) if x["data_source"] == src]
            m[f"reward/{src}"] = float(scores[idx].mean())
            m[f"accuracy/{src}"] = float(acc[idx].mean())
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
        m["actor/lr"] = float(self.optimizer_lr(int(self.state.step) - 1))
        total_tokens = float(np.sum(batch["positions"] >= 0))
        m["time/rollout_s"] = t_roll - t0
        m["time/score_s"] = t_score - t_roll
        m["time/update_s"] = t_end - t_score
        m["time/step_s"] = t_end - t0
        m["throughput/tokens_per_s"] = total_tokens / max(t_end - t0, 1e-9)
        m["rollout/generated_tokens_per_s"] = float(tb.loss_mask.sum()) / max(t_roll - t0, 1e-9)
        return m

    def optimizer_lr(self, update: int) -> float:
        return float(learning_rate(self.optim_cfg)(max(update, 0)))

    # -- the loop --------------------------------------------------------------------------------
    @property
    def task_fn(self):
        return qa_task if self.protocol.name == "qa" else sql_task

    def _train_tree(self):
        return {"train": self.state, "rng": self.key}

    def run(self, resume: bool = False) -> dict:
        from tqdm.auto import tqdm

        oc, tc = self.config.output, self.config.train
        os.makedirs(oc.dir, exist_ok=True)
        ckpt = Checkpointer(os.path.join(oc.dir, "checkpoints"), keep=oc.keep)
        start = 0
        if resume:
            got = ckpt.restore_latest(self._train_tree())
            if got is None:
                log.warning("--resume: no usable checkpoint in %s; starting from step 0", ckpt.directory)
            else:
                start, tree, meta = got
                self.state = jax.device_put(tree["train"], self.state_sh)
                self.key = tree["rng"]
                self.stream.position = int(meta["data_position"])
                log.info("resumed from checkpoint %d (data position %d)", start, self.stream.position)
        writer = MetricsWriter(oc.dir, resume_step=start if resume else None, tensorboard=oc.tensorboard)
        self._trim_rollouts(start)
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
            out["adapters"] = export_dart(os.path.join(oc.dir, "adapters"), self.state.params, self.cfg, self.base,
                                          self.tok, self.protocol.tool_open, self.protocol.tool_close,
                                          self.router.convention, base_model=self.config.model.path,
                                          extra={"kind": "dart", "warm_start": self.config.get("warm_start", "")})
        return out


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
        a, b = evals[0], evals[-1]
        lines.insert(4, f"held-out ({int(a['eval/n'])} questions, greedy)  step {a['step']}: reward "
                        f"{a['eval/reward']:.3f}, answers {a['eval/answer_rate']:.2f}   step {b['step']}: reward "
                        f"{b['eval/reward']:.3f}, answers {b['eval/answer_rate']:.2f}")
    if "adapters" in result:
        lines.append(f"adapters {result['adapters']}")
    if all(r.get("protocol/answer_rate", 0) == 0 for r in rows):
        lines.append("note: no rollout reached an <answer>/<solution>: every reward is equal, so every GRPO "
                     "advantage is 0 and only the KL/entropy terms act. Small models need a protocol warm "
                     "start first (WORKSPACE.md, 'Known gaps').")
    return "\n".join(lines)

