"""Supervised warm start: demonstrations -> the same sharded, jitted update as GRPO with ℓ = −log p.

    demos (built from real data + tools, a saved run's correct trajectories, or a file)
      -> evaluation questions removed (`sft.exclude`), held-out validation split
      -> encoded exactly as the agent's id stream (observations tokenised alone, loss mask 0)
      -> epochs × batches: `rl.step.make_train_step` with objective "sft" (token-mean NLL over the
         written tokens, micro-batch accumulation, AdamW, non-finite skip), orbax checkpoints,
         metrics.jsonl + TensorBoard, tqdm
      -> validation NLL, then a greedy protocol check (rollouts of held-out questions with the real
         tool: answer rate, tool calls, reward) before and after
      -> export: a warm-start directory (variant lora: one adapter, merged into the base by
         `config.warm_start` of a later run), a DART directory (variant dart, `init_from`), or an HF
         model directory (variant full)
"""

from __future__ import annotations

import dataclasses
import functools
import json
import logging
import os
import time

import jax
import jax.numpy as jnp
import numpy as np
from jax.sharding import NamedSharding, PartitionSpec as P

from dart_jax.checkpoints.dart_io import export_dart
from dart_jax.data.paths import DATA, repo_path
from dart_jax.data.readers import exclude_questions, load_rows
from dart_jax.errors import UserError
from dart_jax.lab import demos as lab_demos
from dart_jax.rewards.training import make_reward
from dart_jax.rl import batch as batch_lib
from dart_jax.rl.optim import make_optimizer
from dart_jax.rl.placement import init_on_mesh, place_state
from dart_jax.rl.stages import Updater
from dart_jax.rl.step import make_scorer, policy_trees
from dart_jax.roles.router import RouterSpec
from dart_jax.rollout.agent import tool_for
from dart_jax.rollout.protocol import PROTOCOLS
from dart_jax.run.held_out import rollout_eval
from dart_jax.run.loop import RunLoop
from dart_jax.run.metrics import wilson_interval
from dart_jax.run.policy import load_policy, run_mesh
from dart_jax.run.spec import RunSpec, UpdatePlan, run_spec
from dart_jax.run.task import make_tool
from dart_jax.sft import demos as demo_lib
from dart_jax.tokenization.sentinels import row_params, sentinel_ids

log = logging.getLogger(__name__)
BUILDERS = ("qa_retrieval", "sql_exploration", "distill", "file", "lab")


def build_demos(run: RunSpec, tokenizer, get_tool=None) -> tuple[list[dict], dict]:
    """All demonstrations of `sft.data`, evaluation questions removed. -> (demos, stats).
    `get_tool()` gives the raw tool (default: a new `make_tool`), called only if a source needs it."""
    base_dir = os.path.dirname(DATA)
    protocol = PROTOCOLS[run.task]
    out, stats, tool = [], {}, None
    for k, spec in enumerate(run.sft.data):
        spec = dict(spec)
        builder = spec.pop("builder", "")
        if builder not in BUILDERS:
            raise ValueError(f"sft.data[{k}].builder={builder!r}; expected one of {BUILDERS}")
        if builder in ("qa_retrieval", "sql_exploration", "lab") and tool is None:
            tool = get_tool() if get_tool else make_tool(run, protocol)
        if builder == "qa_retrieval":
            rows = load_rows(spec, base_dir)
            got, st = demo_lib.qa_demos(rows, tool, tokenizer,
                                        run.rollout.max_obs_tokens, protocol)
        elif builder == "sql_exploration":
            rows = load_rows(spec, base_dir)
            got, st = demo_lib.sql_demos(rows, tool, run.rollout.max_turns, protocol)
        elif builder == "lab":  # multi-hop demonstrations over a generated world (lab.demos)
            got, st = lab_demos.lab_source(spec, tool, tokenizer, run.rollout.max_obs_tokens, protocol, base_dir)
        elif builder == "distill":
            got, st = demo_lib.distill_demos(repo_path(spec["path"]), float(spec.get("min_score", 1.0)),
                                             int(spec.get("per_question", 1)))
        else:
            got, st = demo_lib.read_demos(repo_path(spec["path"])), {}
            st = {"rows": len(got), "kept": len(got)}
        wrong_task = [d["id"] for d in got if d["task"] != run.task]
        if wrong_task:
            raise ValueError(f"sft.data[{k}] ({builder}) gives {run.task!r}-task training demos of another task: "
                             f"{wrong_task[:3]}")
        stats[f"{k}:{builder}"] = st
        out += got
    held_out = [r for ex in run.sft.exclude for r in load_rows(dict(ex), base_dir, require_db=False)]
    out, dropped = exclude_questions(out, held_out)
    stats["excluded_eval_questions"] = dropped
    stats["eval_questions_checked"] = len(held_out)
    if not out:
        raise ValueError("sft.data produced no demonstrations")
    return out, stats


class SFTTrainer:
    def __init__(self, config):
        self.config = config
        self.spec = spec = run_spec(config, jax.process_count())  # every setting parsed and checked, once
        if spec.sft is None:
            raise UserError("launch.sft needs a config with an sft section (configs/sft_quickstart.py)")
        sc = spec.sft
        self.method = spec.method
        self.loss_cfg = dataclasses.replace(spec.loss, objective="sft", kl_coef=0.0, entropy_coef=0.0,
                                            temperature=1.0)
        self.mesh = run_mesh(spec)
        key = jax.random.PRNGKey(sc.seed)
        self.cfg, base, self.tok, adapters = load_policy(spec, self.mesh, key)
        self.protocol = PROTOCOLS[spec.task]

        demos, self.data_stats = build_demos(spec, self.tok, lambda: self.tool)
        order = np.random.default_rng(sc.seed).permutation(len(demos))
        n_val = min(int(sc.val_size), len(demos) // 5)
        self.val = [demos[i] for i in order[:n_val]]
        self.train = [demos[i] for i in order[n_val:]]
        obs, tags = spec.rollout.max_obs_tokens, spec.rollout.prompt_tags
        enc = [demo_lib.encode_demo(self.tok, d, obs, tags) for d in self.train]
        keep = [i for i, (p, r, _) in enumerate(enc) if len(p) + len(r) <= sc.max_length]
        self.data_stats["too_long"] = len(enc) - len(keep)
        self.train, self.encoded = [self.train[i] for i in keep], [enc[i] for i in keep]
        self.val_encoded = [e for e in (demo_lib.encode_demo(self.tok, d, obs, tags) for d in self.val)
                            if len(e[0]) + len(e[1]) <= sc.max_length]
        # the protocol check's questions: held-out demonstrations by default, or `sft.check_data`
        # (dataset entries: e.g. other databases than training's, the SQL quickstart's split)
        self.check_rows = self.val
        if sc.check_data:
            self.check_rows = [r for entry in sc.check_data for r in load_rows(dict(entry), os.path.dirname(DATA))]
            _, leaked = exclude_questions(self.train + self.val, self.check_rows)
            if leaked:
                raise ValueError(f"sft.check_data shares {leaked} questions with the demonstrations: the protocol "
                                 "check would measure memorisation")
        self.lengths = np.array([len(p) + len(r) for p, r, _ in self.encoded])
        self.steps_per_epoch = len(self.encoded) // sc.batch_size
        if self.steps_per_epoch == 0:
            raise ValueError(f"{len(self.encoded)} training demonstrations < sft.batch_size ({sc.batch_size})")
        self.total_steps = int(sc.epochs) * self.steps_per_epoch
        self.optim_cfg = dataclasses.replace(spec.optim, total_steps=spec.optim.total_steps or self.total_steps)
        self.optimizer = make_optimizer(self.optim_cfg)
        self.state, self.base = place_state(self.method, self.cfg, base, adapters, self.optimizer, self.mesh)
        # the added tags' embedding (and untied head) rows train with the adapters: seeded from their
        # words, they are otherwise nearly those words at a tied output head, and sampling confuses them
        self.row_ids: tuple[int, ...] = ()
        if sc.train_tag_rows and not self.method.trains_base:
            self.row_ids = tuple(sentinel_ids(self.tok).values())
            rows = jax.device_put(row_params(self.base, self.cfg, self.row_ids), NamedSharding(self.mesh, P()))
            self.state = init_on_mesh({"adapters": self.state.compute_params(), "rows": rows}, self.optimizer,
                                      self.mesh)
        self.key = jax.random.fold_in(key, 2)
        ids = sentinel_ids(self.tok, (self.protocol.tool_open, self.protocol.tool_close))
        self.router = RouterSpec((ids[self.protocol.tool_open],), (ids[self.protocol.tool_close],),
                                 spec.router_convention)
        self.updater = Updater(self.cfg, self.method, self.loss_cfg, self.optim_cfg,
                               UpdatePlan(sc.batch_size, sc.micro_batch, shuffle_minibatches=False, seed=sc.seed,
                                          pad_multiple=64),
                               self.mesh, self.row_ids)
        score = make_scorer(self.cfg, 1.0, self.loss_cfg.logprob_chunk)
        method, row_ids = self.method, self.row_ids

        def logp(params, base, tokens, positions, routes):
            b, a = policy_trees(method, params, base, row_ids)
            return score(b, a, tokens, positions, routes)

        self._logp = jax.jit(logp)

    @functools.cached_property
    def tool(self):
        """The task's tool, opened once (index + encoder, or the SQLite executor) for the demonstration
        builders and every protocol check."""
        return make_tool(self.spec, self.protocol)

    # -- batches -------------------------------------------------------------------------------------
    def _arrays(self, encoded: list) -> dict[str, np.ndarray]:
        ids, pos, mask = demo_lib.pack_rows(encoded)
        return batch_lib.token_arrays(ids, pos, mask, self.method, self.router, self.spec.train.pad_multiple)

    def batch(self, step: int) -> dict[str, np.ndarray]:
        """Step `step`'s batch [batch_size, T]: epoch-wise seeded shuffles, so a resumed run sees the same."""
        sc = self.spec.sft
        epoch, k = divmod(step, self.steps_per_epoch)
        rows = epoch_batches(self.lengths, sc.batch_size, sc.seed, epoch, sc.group_by_length)[k]
        return self._arrays([self.encoded[i] for i in rows])

    def _update(self, batch: dict, step: int) -> dict:
        """One SFT step = one update of the shared update stage (both schedule clocks agree)."""
        self.state, (m,) = self.updater(self.state, self.base, batch, step, jax.random.fold_in(self.key, step))
        return m

    def validation_nll(self) -> float:
        """Token-mean NLL of the written tokens of the held-out demonstrations."""
        if not self.val_encoded:
            return float("nan")
        mb = self.spec.sft.micro_batch
        total, count = 0.0, 0.0
        for s in range(0, len(self.val_encoded), mb):
            a = self._arrays(self.val_encoded[s:s + mb])
            lp = np.asarray(self._logp(self.state.compute_params(), self.base, jnp.asarray(a["tokens"]),
                                       jnp.asarray(a["positions"]), jnp.asarray(a["route_ids"])))
            total += float(-(lp * a["loss_mask"]).sum())
            count += float(a["loss_mask"].sum())
        return total / max(count, 1.0)

    def protocol_check(self, n: int, temperature: float = 0.0) -> dict:
        """Rollouts (greedy, or sampled at `temperature` as GRPO samples) of up to n held-out questions
        with the real tool: does the policy follow the protocol? (`run.held_out.rollout_eval`)"""
        base, ads = policy_trees(self.method, self.state.compute_params(), self.base, self.row_ids)
        return rollout_eval(self.cfg, self.tok, self.protocol, tool_for(self.protocol, self.tool), self.spec.rollout,
                            self.spec.router_convention, base, ads, self.check_rows[:n], temperature,
                            max(self.spec.sft.micro_batch, 8), reward=make_reward(self.spec.task, self.spec.reward),
                            mesh=self.mesh)

    # -- the loop ------------------------------------------------------------------------------------
    def run(self, resume: bool = False, overwrite: bool = False, allow_change=()) -> dict:
        """SFT to the configured length; output.dir and resume rules as for GRPO (`run.loop`)."""
        sc, oc = self.spec.sft, self.spec.output
        loop = RunLoop(self.config, self.total_steps, "SFT", resume, overwrite, allow_change=allow_change)
        self.state, self.key, _ = loop.restore(self.state, self.key)
        if resume:
            log.info("resumed SFT from checkpoint %d", loop.start)
        loop.begin()
        demo_lib.write_demos(os.path.join(oc.dir, "demos.jsonl"), self.train)
        demo_lib.write_demos(os.path.join(oc.dir, "demos_val.jsonl"), self.val)
        summary: dict = {"data": self.data_stats, "train_demos": len(self.encoded), "val_demos": len(self.val),
                         "steps": self.total_steps}
        temp = float(self.spec.sampling.temperature)
        if sc.protocol_check and not loop.start:
            summary["before"] = self.protocol_check(int(sc.protocol_check))
            summary["before"]["val_nll"] = self.validation_nll()
            if sc.sampled_check:
                summary["before_sampled"] = self.protocol_check(int(sc.protocol_check), temp)
        for step in loop.steps():
            t0 = time.perf_counter()
            batch = self.batch(step)
            m = self._update(batch, step)
            dt = time.perf_counter() - t0
            row = {"sft/loss": float(m["loss"]), "sft/nll": float(m["nll"]), "sft/entropy": float(m["entropy"]),
                   "sft/grad_norm": float(m["grad_norm"]), "sft/skipped_updates": float(m["skipped"]),
                   "sft/lr": float(m["lr"]),
                   "sft/loss_tokens": float(m["loss_tokens"]), "time/step_s": dt,
                   "throughput/tokens_per_s": float(np.sum(batch["positions"] >= 0)) / max(dt, 1e-9),
                   "epoch": step // self.steps_per_epoch}
            if (step + 1) % sc.eval_every == 0 or step + 1 == self.total_steps:
                row["sft/val_nll"] = self.validation_nll()
            loop.write(step + 1, row, nll=f"{row['sft/nll']:.3f}", s=f"{dt:.1f}")
            loop.checkpoint(step + 1, self.state, self.key)
        result = loop.close("sft_curve.png", ("sft/nll", "sft/val_nll", "sft/grad_norm"))
        summary["after"] = {"val_nll": self.validation_nll()}
        if sc.protocol_check:
            summary["after"].update(self.protocol_check(int(sc.protocol_check)))
            if sc.sampled_check:
                summary["after_sampled"] = self.protocol_check(int(sc.protocol_check), temp)
        result["summary"] = summary
        result["export"] = self.export(os.path.join(oc.dir, "warm_start" if self.method.variant == "lora" else
                                                    "adapters" if self.method.variant == "dart" else "model"), summary)
        with open(os.path.join(oc.dir, "sft_summary.json"), "w") as f:
            json.dump(summary, f, indent=2, default=str)
        return result

    def export(self, out_dir: str, summary: dict) -> str:
        variant = self.method.variant
        if variant == "full":
            from dart_jax.checkpoints.hf_export import save_hf
            return save_hf(self.state.compute_params(), self.cfg, out_dir, self.tok)
        extra = {"kind": "warm_start" if variant == "lora" else "dart", "variant": variant,
                 "warm_start": self.spec.warm_start,
                 "sft": {"steps": self.total_steps, "train_demos": len(self.encoded),
                         "val_nll": summary["after"]["val_nll"]}}
        base, adapters = policy_trees(self.method, self.state.compute_params(), self.base, self.row_ids)
        return export_dart(out_dir, adapters, self.cfg, base, self.tok, self.protocol.tool_open,
                           self.protocol.tool_close, self.spec.router_convention,
                           base_model=self.spec.model.path, extra=extra, dtype=self.spec.sft.export_dtype)


GROUP_CHUNK = 16  # batches per length-sorted chunk (group_by_length)


def epoch_batches(lengths: np.ndarray, batch_size: int, seed: int, epoch: int, group_by_length: bool) -> list:
    """Epoch `epoch`'s batches (row indices), len(lengths) // batch_size of them (the remainder sits out).
    Seeded by (seed, epoch), so a resumed run sees the same. With `group_by_length`, as HF Trainer's
    option of that name: the shuffled rows are cut into chunks of GROUP_CHUNK batches, each chunk is
    sorted by length and cut into batches, and the batches are shuffled: each pads to nearly its own
    rows' length instead of the longest of a random eight."""
    rng = np.random.default_rng([seed, epoch])
    order = rng.permutation(len(lengths))
    n = len(lengths) // batch_size
    if not group_by_length:
        return [order[k * batch_size:(k + 1) * batch_size] for k in range(n)]
    chunk = GROUP_CHUNK * batch_size
    parts = [order[s:s + chunk] for s in range(0, len(order), chunk)]
    rows = np.concatenate([p[np.argsort(-lengths[p], kind="stable")] for p in parts])
    batches = [rows[k * batch_size:(k + 1) * batch_size] for k in range(len(rows) // batch_size)]
    return [batches[i] for i in rng.permutation(len(batches))[:n]]


def _count(r: dict) -> str:
    if "correct" not in r:
        return "—"
    n = int(r.get("scored", r["n"]))
    lo, hi = wilson_interval(int(r["correct"]), n)
    return f"{int(r['correct'])}/{n} (95% CI {lo:.2f}–{hi:.2f})"


def sft_summary(result: dict) -> str:
    s = result["summary"]
    lines = [f"SFT: {s['train_demos']} demonstrations ({s['val_demos']} held out), {s['steps']} steps",
             f"held-out NLL     before {s.get('before', {}).get('val_nll', float('nan')):.3f}   "
             f"after {s['after']['val_nll']:.3f}"]
    for mode, label in (("", "greedy"), ("_sampled", "sampled")):
        b, a = s.get("before" + mode, {}), s.get("after" + mode, {})
        if "answer_rate" not in a:
            continue
        for key, name in (("answer_rate", "answers"), ("tool_calls", "tool calls"), ("reward", "reward")):
            lines.append(f"{label + ' ' + name:<17} before {b.get(key, float('nan')):.2f}    after {a[key]:.2f}")
        if "correct" in a:
            lines.append(f"{label + ' correct':<17} before {_count(b)}    after {_count(a)}")
    lines += [f"excluded evaluation questions: {s['data'].get('excluded_eval_questions', 0)}",
              f"metrics {result['metrics']}", f"plot {result['plot']}", f"export {result['export']}"]
    return "\n".join(lines)
