"""Gradient alignment end to end (the paper's interference analysis) as resumable stages under one directory
(`config.grad_angles.out`):

    rollouts/chunk_NNN.npz    G samples per query at T = `temperature` by the policy (the config's model
                              + warm start, or a checkpoint), `chunk` queries at a time, until `queries`
                              groups with mixed outcomes (some right, some wrong) are in hand or the pool
                              (`datasets`, first `limit`) ends; settings.json records what sampled them, and
                              a different setting samples again (with a warning naming why): experiments.grad_sample
    grads/<params>/<protocol>/<uid>.npz
                              per mixed query: `paper` — the Gram matrix, per unit (tensor × layer), of the
                              2G per-trajectory role gradients (reasoning of each trajectory, tool of each;
                              with `control`, 4G: then each trajectory's two random token sets of the
                              roles' sizes, the role-agnostic control);
                              `authors` — per-unit (g1·g2, |g1|², |g2|²) of tool(A)·answer(A) and
                              tool(A)·tool(B) for two 5-subsets A, B, per weighting. A query's file is its
                              checkpoint: an interrupted stage resumes at the next query
    report/                   angles.csv, summary.json, report.md and the figures (analysis.grad_report)
    stages.json               each stage's wall time

The degeneracy gate (experiments.gate, `gate`) on the sampled texts: the report writes its verdict into
report/summary.json and report.md; under `gate="strict"` sampling stops at the first chunk that shows a
template, and the grads and report stages refuse such rollouts.

Gradients (experiments.grad_roles): one backward pass per role, the GRPO surrogate at ratio 1 restricted to
the role's tokens, token-mean; `params=full` differentiates the whole backbone (the paper; under a
checkpoint's adapters held fixed), `adapters` the policy's adapters (a fresh shared LoRA of rank
`adapter_rank` when the policy has none: its B = 0, so only B receives gradient, g_B = g_W·Aᵀ, a random
projection of the backbone's gradient).

Weighting (the paper leaves open whether the advantage weights the per-trajectory gradient): the paper
protocol computes the log-likelihood gradient g(τ) once per (trajectory, role); the advantage-weighted
gradient is A_τ·g(τ) exactly (the token-mean's denominator is τ's own), so its angles follow: a
cross-role angle within τ is unchanged (A_τ² > 0), a same-role angle between τ and τ' is θ when
A_τ A_τ' > 0 and 180° − θ when < 0, undefined when an advantage is 0 (tested against direct passes).
The authors' protocol weights inside a 5-response batch, so it runs both weightings as passes.

Same-role pairs need all G gradients of a role at once: exact Gram matrices when 2G gradient trees fit
in `exact_max_gb`, else a seeded CountSketch of each gradient (`sketch_dim` buckets per unit;
analysis.grad_angles.Sketch), whose angles the tests hold to exact ones.
"""

from __future__ import annotations

import json
import logging
import os
import shutil
import time

import jax
import numpy as np

from dart_jax.analysis import grad_angles as ga
from dart_jax.analysis.grad_angles import (
    GRAD_PROTOCOLS,
    PARAMS,
    WEIGHTINGS,
    exact_gram,
    pick_subset,
    sketch_gram,
    tree_nbytes,
)
from dart_jax.analysis.grad_report import write_report
from dart_jax.experiments import gate as dgate
from dart_jax.experiments.grad_sample import GradSamples, Group
from dart_jax.experiments.stage_log import StageLog

log = logging.getLogger(__name__)

STAGES = ("sample", "grads", "report")


def _section(config):
    if "grad_angles" not in config:
        raise ValueError("launch.grad_angles needs a config with a `grad_angles` section "
                         "(configs/grad_angles_quickstart.py)")
    c = config.grad_angles
    bad = [p for p in c.params if p not in PARAMS] + [p for p in c.protocols if p not in GRAD_PROTOCOLS]
    if bad:
        raise ValueError(f"config.grad_angles: unknown params / protocols {bad}; expected {PARAMS} / {GRAD_PROTOCOLS}")
    if int(c.group_size) < 2:
        raise ValueError(f"config.grad_angles.group_size = {c.group_size}: same-role pairs need at least 2")
    if "authors" in c.protocols and int(c.group_size) < int(c.authors_k):
        raise ValueError(f"config.grad_angles.group_size {c.group_size} < authors_k {c.authors_k}")
    return c


class Study(GradSamples, StageLog):
    """The stages of one gradient-alignment experiment; each skips what its outputs show is done."""
    STAGES = STAGES
    STUDY = "grad_angles"

    def __init__(self, config, checkpoint: str | None = None, step: int | None = None, gate: str = "warn"):
        self.config, self.checkpoint, self.step = config, checkpoint, step
        self.gate = dgate.check_mode(gate)
        self.c = _section(config)
        self.out = self.c.out
        os.makedirs(self.out, exist_ok=True)
        self._policy = None
        self._rg: dict = {}
        self._sketch = None

    def policy(self):
        if self._policy is None:
            from dart_jax.eval.policy import load_eval_policy
            from dart_jax.run.policy import run_mesh
            from dart_jax.run.spec import run_spec
            spec = run_spec(self.config)
            self._policy = load_eval_policy(spec, run_mesh(spec), self.checkpoint,
                                            step=self.step, seed=int(self.c.seed))
        return self._policy

    # -- gradients ---------------------------------------------------------------------------------
    def grad_dir(self, params: str, protocol: str) -> str:
        return os.path.join(self.out, "grads", params, protocol)

    def _role_grads(self, params: str, weighting: str, tags_in_tool: bool = False):
        """-> (RoleGradients, trainable tree, base) for `params` (built once per (params, weighting): each
        RoleGradients owns its jitted passes)."""
        key = (params, weighting, tags_in_tool)
        if key not in self._rg:
            self._rg[key] = self._build_role_grads(params, weighting, tags_in_tool)
        return self._rg[key]

    def _build_role_grads(self, params: str, weighting: str, tags_in_tool: bool):
        from dart_jax.adapters.method import MethodSpec, init_adapters
        from dart_jax.experiments.grad_roles import RoleGradients
        from dart_jax.roles.router import RouterSpec
        from dart_jax.rollout.protocol import PROTOCOLS as TASKS, tag_variants
        from dart_jax.tokenization.sentinels import sentinel_ids
        pol = self.policy()
        protocol = TASKS[self.config.task]
        tok = pol.tokenizer
        ids = sentinel_ids(tok, (protocol.tool_open, protocol.tool_close))
        router = RouterSpec((ids[protocol.tool_open],), (ids[protocol.tool_close],),
                            pol.router_convention or self.config.router.convention)
        answer_tags = (tuple(tag_variants(tok, protocol.answer_open)), tuple(tag_variants(tok, protocol.answer_close)))
        wrt = "trainable"
        if params == "full" and not pol.adapters:
            method = MethodSpec("full")
            tree = pol.base
        elif pol.adapters:
            names = sorted(pol.adapters)
            method = MethodSpec("dart" if len(names) == 2 else "lora", rank=int(self.config.method.rank))
            tree = pol.adapters
            if params == "full":  # the adapted policy's backbone gradient, its adapters held fixed
                wrt = "base"
        else:
            rank = int(self.c.adapter_rank)
            method = MethodSpec("lora", rank=rank, alpha=2.0 * rank)
            tree = init_adapters(method, pol.cfg, jax.random.PRNGKey(int(self.c.seed)))
        rg = RoleGradients(pol.cfg, method, router, weighting, pad_multiple=int(self.config.train.pad_multiple),
                           answer_tags=answer_tags, tags_in_tool=tags_in_tool, wrt=wrt)
        return rg, tree, pol.base

    def grad_settings(self, params: str, protocol: str) -> dict:
        """What a (params, protocol) directory's per-query files depend on besides the rollouts."""
        c = self.c
        out = {"checkpoint": self.checkpoint or "", "step": self.step, "params": params, "protocol": protocol}
        if params == "adapters":
            out["adapter_rank"] = int(c.adapter_rank)
            out["seed"] = int(c.seed)
        if protocol == "paper":
            out.update(exact_max_gb=float(c.exact_max_gb), sketch_dim=int(c.sketch_dim), sketch_seed=int(c.sketch_seed))
            if _control(c):  # named only when on: gradients computed before the control existed stay valid
                out.update(control=True, seed=int(c.seed))
        else:
            out.update(authors_k=int(c.authors_k), seed=int(c.seed))
        return out

    def grads_mismatch(self, params: str, protocol: str) -> list[str]:
        path = os.path.join(self.grad_dir(params, protocol), "settings.json")
        if not os.path.isfile(path):
            return []
        with open(path) as f:
            got = json.load(f)
        want = self.grad_settings(params, protocol)
        # both ways: a setting saved but no longer named (the control switched off) is a difference too
        return [f"{k}: {got.get(k)!r} → {want.get(k)!r}" for k in dict.fromkeys([*want, *got])
                if got.get(k) != want.get(k)]

    def grads(self) -> dict:
        c = self.c
        groups = self.mixed_groups()
        if not groups:
            raise FileNotFoundError(f"grad_angles grads: no mixed groups under {self.rollout_dir()} (run the sample "
                                    "stage first)")
        if self.gate == "strict":
            self.check_gate()
        done = {}
        from tqdm.auto import tqdm
        for params in c.params:
            for protocol in c.protocols:
                d = self.grad_dir(params, protocol)
                diffs = self.grads_mismatch(params, protocol)
                if diffs:
                    log.warning("grad_angles grads %s/%s: %s was computed differently (%s): computing again",
                                params, protocol, d, "; ".join(diffs))
                    shutil.rmtree(d)
                os.makedirs(d, exist_ok=True)
                with open(os.path.join(d, "settings.json"), "w") as f:
                    json.dump(self.grad_settings(params, protocol), f, indent=1)
                todo = [g for g in groups if not os.path.isfile(os.path.join(d, f"{_safe(g.uid)}.npz"))]
                if not todo:
                    done[f"{params}/{protocol}"] = "skipped"
                    continue
                t0 = time.perf_counter()
                fn = self._paper_query if protocol == "paper" else self._authors_query
                for g in tqdm(todo, desc=f"{params}/{protocol}", unit="query"):
                    tq = time.perf_counter()
                    stats = fn(params, g)
                    stats["seconds"] = time.perf_counter() - tq  # so an interrupted stage still has its time
                    path = os.path.join(d, f"{_safe(g.uid)}.npz")
                    np.savez(path + ".tmp.npz", uid=g.uid, **stats)
                    os.replace(path + ".tmp.npz", path)
                self._record("grads", f"{params}/{protocol}", time.perf_counter() - t0, queries=len(todo))
                done[f"{params}/{protocol}"] = len(todo)
        return done

    def _paper_query(self, params: str, g: Group) -> dict:
        """2G log-likelihood gradients (reasoning, then tool, per trajectory) -> their per-unit Gram; with the
        control on, 4G: then each trajectory's two random token sets of the roles' sizes (set A, then set B;
        RoleGradients.random_split, seeded by (seed, query, trajectory))."""
        import jax.numpy as jnp

        from dart_jax.rl.advantages import grpo_advantages
        rg, tree, base = self._role_grads(params, "loglik")
        n = len(g.scores)
        control = _control(self.c)
        adv = np.asarray(grpo_advantages(jnp.asarray(g.scores), jnp.zeros(n, jnp.int32), 1))
        rows = (4 if control else 2) * n
        exact = rows * tree_nbytes(base if rg.wrt == "base" else tree) <= float(self.c.exact_max_gb) * 2 ** 30
        if not exact and self._sketch is None:
            self._sketch = ga.Sketch(int(self.c.sketch_dim), int(self.c.sketch_seed))
        sketch = self._sketch
        held, tokens = [], []

        def held_form(grad):  # a tree when exact, else its sketch (never many full trees at once)
            return grad if exact or grad is None else sketch(grad)

        def keep(grad, k):
            tokens.append(k)
            held.append(held_form(grad))

        def row(i):  # right-padded: a pass needs only the row's tokens
            w = int((g.positions[i] >= 0).sum())
            return g.ids[i:i + 1, :w], g.positions[i:i + 1, :w], g.loss_mask[i:i + 1, :w], adv[i:i + 1]

        for role in ("reasoning", "tool"):
            for i in range(n):
                keep(*rg(tree, base, *row(i), role))
        if control:
            halves: tuple[list, list] = ([], [])
            for i in range(n):
                rng = np.random.default_rng([int(self.c.seed), _stable(g.uid), i])
                for h, (grad, k) in enumerate(rg.random_split(tree, base, *row(i), rng)):
                    halves[h].append((held_form(grad), k))
            for grad, k in halves[0] + halves[1]:
                tokens.append(k)
                held.append(grad)
        names, layers, gram = exact_gram(held) if exact else sketch_gram(held)
        return {"gram": gram, "names": names, "layers": layers, "present": np.asarray(tokens) > 0,
                "tokens": np.asarray(tokens), "advantages": adv, "scores": g.scores, "accuracy": g.accuracy,
                "exact": exact, "sketch_dim": 0 if exact else int(self.c.sketch_dim), "control": control}

    def _authors_query(self, params: str, g: Group) -> dict:
        """Per weighting: tool(A) vs answer(A) (cross) and tool(A) vs tool(B) (same role), per unit."""
        import jax.numpy as jnp

        from dart_jax.rl.advantages import grpo_advantages
        k = int(self.c.authors_k)
        rng = np.random.default_rng([int(self.c.seed), _stable(g.uid)])
        a, b = pick_subset(g.accuracy, k, rng), pick_subset(g.accuracy, k, rng)
        out = {"subset_a": a, "subset_b": b, "accuracy": g.accuracy, "scores": g.scores}
        for weighting in WEIGHTINGS:
            rg, tree, base = self._role_grads(params, weighting, tags_in_tool=True)
            grads = {}
            for name, idx, role in (("tool_a", a, "tool"), ("answer_a", a, "answer"), ("tool_b", b, "tool")):
                adv = np.asarray(grpo_advantages(jnp.asarray(g.scores[idx]), jnp.zeros(k, jnp.int32), 1))
                w = int((g.positions[idx] >= 0).sum(1).max())
                grads[name], _ = rg(tree, base, g.ids[idx, :w], g.positions[idx, :w], g.loss_mask[idx, :w], adv, role)
            ref = next((v for v in grads.values() if v is not None), None)
            if ref is None:
                raise ValueError(f"query {g.uid}: no tool or answer tokens in its subsets")
            units = ga.pair_stats(ref, ref)
            out["names"], out["layers"] = units.tensor, units.layer
            for kind, (x, y) in (("cross", ("tool_a", "answer_a")), ("same", ("tool_a", "tool_b"))):
                if grads[x] is None or grads[y] is None:  # a role without tokens in a subset: undefined
                    nan = np.full(len(units.dot), np.nan)
                    out.update({f"{weighting}_{kind}_{v}": nan for v in ("dot", "n1", "n2")})
                    continue
                st = ga.pair_stats(grads[x], grads[y])
                out.update({f"{weighting}_{kind}_dot": st.dot, f"{weighting}_{kind}_n1": st.n1,
                            f"{weighting}_{kind}_n2": st.n2})
            del grads
        return out

    # -- report ------------------------------------------------------------------------------------
    def report_cells(self) -> list[tuple[str, str]]:
        """Every (params, protocol) with gradients on disk computed under this study's settings, the config's
        first: --params / --protocol restrict what the grads stage computes, not what the report shows (a stage
        run for one protocol keeps the other's results in the report). Gradients computed under other settings
        are left out, with a warning naming the difference, and so are gradients whose settings are unknown
        (no settings.json). Rollouts sampled under other settings are an error: the report would misdescribe
        them (the sample stage resamples)."""
        diffs = self.sample_mismatch()
        if diffs:
            raise ValueError(f"grad_angles report: the rollouts under {self.rollout_dir()} were sampled under other "
                             f"settings ({'; '.join(diffs)}): run the sample stage (it samples again) or report with "
                             "the settings they were sampled with")
        cells = []
        for params in dict.fromkeys([*self.c.params, *PARAMS]):
            for protocol in dict.fromkeys([*self.c.protocols, *GRAD_PROTOCOLS]):
                d = self.grad_dir(params, protocol)
                if not os.path.isdir(d):
                    continue
                diffs = (self.grads_mismatch(params, protocol) if os.path.isfile(os.path.join(d, "settings.json"))
                         else ["no settings.json: settings unknown"])
                if diffs:
                    log.warning("grad_angles report: %s was computed under other settings (%s): left out (run "
                                "--stage=grads --params=%s --protocol=%s to compute it again)",
                                d, "; ".join(diffs), params, protocol)
                    continue
                cells.append((params, protocol))
        return cells

    def report(self) -> dict:
        t0 = time.perf_counter()
        cells = self.report_cells()
        gate = self.check_gate()
        out = os.path.join(self.out, "report")
        summary = write_report(self.out, out, self.c, self.times(), cells=cells)
        if gate is not None:
            dgate.add_to_report(out, gate)
            summary[dgate.KEY] = gate
        self._record("report", "all", time.perf_counter() - t0)
        return summary



def _control(c) -> bool:
    """The role-agnostic control is on (`grad_angles.control`; configs written before it have none: off)."""
    return bool(c.get("control", False))


def _safe(uid: str) -> str:
    return "".join(ch if ch.isalnum() or ch in "-_." else "_" for ch in str(uid))


def _stable(uid: str) -> int:
    import zlib
    return zlib.crc32(str(uid).encode()) & 0x7FFFFFFF
