"""CEA end to end (the paper's Capability Effect Attribution) as resumable stages over one output
directory (`config.cea.out`):

    train/<reas|tool|unified>/   the three trained variants: the config with each role mask
                                 (`cea.role_masks`), same data, steps, seed (rl.trainer; resumed from its
                                 newest finished checkpoint when interrupted, started afresh when it has
                                 none, skipped when it reached train.steps; a directory written by another
                                 configuration is refused, field by field)
    sample/<variant>/            the six variants sampled at T = `cea.temperature`, `cea.n_samples` per
                                 question from the trained runs' checkpoints at train.steps (eval.job;
                                 skipped when its results.json records the same samples, seed, data and
                                 checkpoint steps; an interrupted sample, or one of fewer questions
                                 (`cea.limit` raised), is continued — eval.resume reuses the batches that
                                 one uninterrupted run would sample identically; sampled again, with a
                                 warning naming why, otherwise)
    solve/                       β per question, its uncertainty, report.md and the figures (analysis.cea_report;
                                 seconds, so it always runs)
    stages.json                  each stage's wall time and when it finished

The degeneracy gate (experiments.gate, `gate`): each variant's sampled trajectories (sample/<v>/per_question.jsonl)
are gated; the solve stage writes the verdict into solve/summary.json and report.md. Under `gate="strict"` the
train stage samples M_Base first (the sample stage then skips it) and refuses before training when its
trajectories fill a template, and the sample stage refuses at the first flagged variant.

The variants: M_Base = the config's model (+ its warm start); M_Reas / M_Tool / M_Unified = the
trained runs; H_Tool = reasoning by M_Base, tool spans by M_Tool; H_Reas = reasoning by M_Reas, tool
spans by M_Base (two models with their own KV caches and append-only hand-offs: rollout.compose).
Every variant samples with the same seed: the sampler keys each draw by (seed, row, position), so the
six share their random numbers and their accuracy differences carry less sampling noise.
"""

from __future__ import annotations

import copy
import json
import logging
import os
import shutil
import time

from dart_jax.analysis import cea
from dart_jax.analysis.cea_report import interference_and_report, read_inputs, solve_and_report
from dart_jax.experiments import gate as dgate
from dart_jax.experiments.cea_screen import lab_cells, sample_sets, screen_stage, selection_digests
from dart_jax.experiments.stage_log import StageLog
from dart_jax.parallel.distributed import from_main, on_main

log = logging.getLogger(__name__)

TRAINED = ("reas", "tool", "unified")
STAGES = ("screen", "train", "sample", "solve")
# variant -> (main policy: a trained variant or None for M_Base, composition: (role, trained variant) or None)
SOURCES = {
    "base": (None, None),
    "reas": ("reas", None),
    "tool": ("tool", None),
    "unified": ("unified", None),
    "h_tool": (None, ("tool", "tool")),
    "h_reas": (None, ("reasoning", "reas")),
}
assert tuple(SOURCES) == cea.VARIANTS


def _cea(config):
    if "cea" not in config:
        raise ValueError("launch.cea needs a config with a `cea` section (configs/cea.py, configs/cea_quickstart.py)")
    c = config.cea
    missing = [v for v in TRAINED if v not in c.role_masks]
    if missing:
        raise ValueError(f"config.cea.role_masks lacks {missing}; expected one role mask per trained variant {TRAINED}")
    if int(c.n_samples) < 2:
        raise ValueError(f"config.cea.n_samples = {c.n_samples}: per-question accuracy needs at least 2 samples")
    return c


def train_seeds(c) -> list:
    """`cea.train_seeds` ("0,1,2": each trained variant once per seed, under <variant>_s<seed>) -> the seeds;
    [None] when unset (one run of each at train.seed, under <variant>)."""
    raw = c.get("train_seeds", "") or ""
    seeds = [int(x) for x in (raw.split(",") if isinstance(raw, str) else raw) if str(x).strip()]
    if len(set(seeds)) != len(seeds):
        raise ValueError(f"config.cea.train_seeds = {raw!r} names a seed twice")
    return seeds or [None]


def run_key(variant: str, seed: int | None = None) -> str:
    return variant if seed is None else f"{variant}_s{seed}"


def train_dir(config, variant: str, seed: int | None = None) -> str:
    return os.path.join(_cea(config).out, "train", run_key(variant, seed))


def variant_config(config, variant: str, seed: int | None = None):
    """The training config of one trained variant (of one seed): the shared config with its role mask,
    seed and directory."""
    c = copy.deepcopy(config)
    c.method.role_mask = _cea(config).role_masks[variant]
    c.output.dir = train_dir(config, variant, seed)
    if seed is not None:
        c.train.seed = int(seed)
    return c


def trained_steps(run: str) -> int:
    """The newest step of a run directory whose checkpoint finished (its integrity manifest was written
    after the orbax save; 0: none)."""
    from dart_jax.run.checkpoint import checkpoint_steps
    ck = os.path.join(run, "checkpoints")
    done = [s for s in checkpoint_steps(ck) if os.path.isfile(os.path.join(ck, "integrity", f"{s}.json"))]
    return max(done) if done else 0


def _trainer_view(d: dict) -> dict:
    """A config's sections the trainer reads: a study's own section (`cea`, `methods`, …) dropped."""
    from dart_jax.run.spec import SECTIONS, TOP_LEVEL
    return {k: v for k, v in d.items() if k in SECTIONS or k == "sft" or k in TOP_LEVEL}


def config_mismatch(run: str, vc) -> list[str]:
    """How the configuration that wrote `run` differs from `vc` (besides what a resume may change and
    the studies' own sections): the three variants must differ only in their role masks."""
    from dart_jax.run.run_dir import RESUMABLE, config_dict, config_differences, saved_config
    saved = saved_config(run)
    if saved is None:
        return []
    return config_differences(_trainer_view(saved), _trainer_view(config_dict(vc)), ignore=RESUMABLE)


def adopted_dir(c, variant: str, seed: int | None) -> str | None:
    """`cea.adopt[variant]` (a run directory, "{seed}" filled in) or None: a variant's training done by
    another study under the same run configuration (the lab's M_Unified is the method comparison's full
    fine-tuning: configs/cea_lab.py). Where that directory does not exist the variant is trained here."""
    template = (c.get("adopt") or {}).get(variant)
    return template.format(seed=seed) if template else None


class CEAStages(StageLog):
    """The stages of one CEA experiment; each skips what its outputs show is done."""
    STAGES = STAGES
    STUDY = "CEA"

    def __init__(self, config, gate: str = "warn"):
        self.config = config
        self.gate = dgate.check_mode(gate)
        self.c = _cea(config)
        self.out = self.c.out
        self.seeds = train_seeds(self.c)
        os.makedirs(self.out, exist_ok=True)

    def keys(self, variants=cea.VARIANTS) -> list[tuple[str, int | None]]:
        """(variant, seed) of every sample: M_Base once, every other variant once per training seed."""
        return [(v, None if v == "base" else s) for v in variants for s in ([None] if v == "base" else self.seeds)]

    # -- screen ------------------------------------------------------------------------------------
    def screen(self) -> dict | None:
        return screen_stage(self)

    # -- train -------------------------------------------------------------------------------------
    def train(self, variants=TRAINED) -> dict:
        from dart_jax.rl.trainer import Trainer
        if self.gate == "strict" and variants:  # M_Base's trajectories gated before any training
            self.sample(("base",))
        done = {}
        for v, seed in ((v, s) for v in variants for s in self.seeds):
            vc = variant_config(self.config, v, seed)
            source = adopted_dir(self.c, v, seed)
            v = run_key(v, seed)
            if source and not os.path.lexists(vc.output.dir):
                if os.path.isdir(source):
                    done[v] = from_main(lambda: self._adopt(v, source, vc))
                    continue
                log.info("CEA train %s: cea.adopt names %s, which does not exist: trained here", v, source)
            # read once, by process 0 (a multi-process run shares config.cea.out)
            have, diffs = from_main(lambda: (trained_steps(vc.output.dir), config_mismatch(vc.output.dir, vc)))
            want = int(vc.train.steps)
            if diffs:
                raise ValueError(f"CEA train {v}: {vc.output.dir} was written by another configuration (" +
                                 "; ".join(diffs) + "): the three variants must share everything but their role "
                                 "mask. Move that directory aside, or give this experiment another cea.out")
            if have >= want:
                log.info("CEA train %s: done (%s holds step %d)", v, vc.output.dir, have)
                done[v] = "skipped"
                continue
            log.info("CEA train %s (role mask %r): %s from step %d to %d", v, vc.method.role_mask, vc.output.dir,
                     have, want)
            t0 = time.perf_counter()
            # no finished checkpoint: whatever records an interrupted start left are replaced
            Trainer(vc).run(resume=have > 0, overwrite=have == 0)
            self._record("train", v, time.perf_counter() - t0, steps=want, resumed_from=have)
            done[v] = "trained"
        return done

    def _adopt(self, key: str, source: str, vc) -> str:
        """Link `source`, a finished run of the same configuration, as variant `key`'s training (one that is
        not finished, or of another configuration, is refused: it would be trained twice, or differently)."""
        have, want = trained_steps(source), int(vc.train.steps)
        diffs = config_mismatch(source, vc) if have else []
        if have < want:
            raise ValueError(f"CEA train {key}: cea.adopt names {source}, which holds step {have} of {want}: "
                             "finish that run first (its study's command resumes it), or drop it from cea.adopt")
        if diffs:
            raise ValueError(f"CEA train {key}: cea.adopt names {source}, written by another configuration ("
                             + "; ".join(diffs) + "): drop it from cea.adopt to train this variant here")
        parent = os.path.dirname(os.path.abspath(vc.output.dir))
        os.makedirs(parent, exist_ok=True)
        os.symlink(os.path.relpath(os.path.abspath(source), parent), vc.output.dir)  # relative: the tree may move
        log.info("CEA train %s: adopted %s (the same run configuration, step %d)", key, source, have)
        self._record("train", key, 0.0, steps=want, resumed_from=have, adopted=os.path.abspath(source))
        return "adopted"

    # -- sample ------------------------------------------------------------------------------------
    def sample_dir(self, variant: str, seed: int | None = None) -> str:
        return os.path.join(self.out, "sample", run_key(variant, seed))

    def sample_mismatch(self, variant: str, seed: int | None = None) -> list[str] | None:
        """None: not sampled; else how the saved sample differs from what this config asks (empty: reusable)."""
        path = os.path.join(self.sample_dir(variant, seed), "results.json")
        if not os.path.isfile(path):
            return None
        with open(path) as f:
            results = json.load(f)
        setup, c, want = results["setup"], self.c, int(self.config.train.steps)
        main, compose = SOURCES[variant]
        expected = {"n_samples": int(c.n_samples), "temperature": float(c.temperature), "seed": int(c.seed),
                    "limit": int(c.limit) if c.limit else None, "model": self.config.model.path,
                    "warm_start": self.config.warm_start,
                    "datasets": sorted(c.datasets), "step": want if main else None,
                    "composition step": want if compose else None, "selected": selection_digests(self)}
        got = {**{k: setup.get(k) for k in ("n_samples", "temperature", "seed", "limit", "model", "warm_start")},
               "datasets": sorted(results["datasets"]), "step": setup.get("step"),
               "composition step": (setup.get("composition") or {}).get("step"), "selected": setup.get("selected")}
        return [f"{k}: {got[k]!r} → {expected[k]!r}" for k in expected if got[k] != expected[k]]

    def sample(self, variants=cea.VARIANTS) -> dict:
        from dart_jax.eval.job import evaluate
        from dart_jax.eval.runner import EvalOptions
        c, want = self.c, int(self.config.train.steps)
        needs = {SOURCES[v][0] for v in variants} | {SOURCES[v][1][1] for v in variants if SOURCES[v][1]}
        missing = from_main(lambda: sorted(run_key(v, s) for v in needs - {None} for s in self.seeds
                                           if trained_steps(train_dir(self.config, v, s)) < want))
        if missing:
            raise FileNotFoundError(f"CEA sample: the trained variants {missing} have no finished checkpoint at "
                                    f"train.steps = {want} under {self.out}/train (run the train stage first)")
        options = EvalOptions(n_samples=int(c.n_samples), temperature=float(c.temperature), batch=int(c.batch),
                              seed=int(c.seed), limit=int(c.limit) if c.limit else None, progress=True)
        sets = sample_sets(self)
        done, early = {}, set(cea.SINGLE) <= set(variants) and any(v not in cea.SINGLE for v in variants)
        for v, seed in self.keys(variants):
            if early and v not in cea.SINGLE:
                early = False
                self._early_b23()
            out, key = self.sample_dir(v, seed), run_key(v, seed)
            diffs = from_main(self.sample_mismatch, v, seed)
            if diffs == []:
                log.info("CEA sample %s: done (%s)", key, out)
                done[key] = "skipped"
                if self.gate == "strict":
                    self.check_gate((v,))
                continue
            if diffs and all(d.startswith("limit:") for d in diffs):  # eval.resume keeps the questions sampled
                log.info("CEA sample %s: %s (%s): sampling the questions not sampled yet", key, out, diffs[0])
            elif diffs:
                log.warning("CEA sample %s: %s was sampled differently (%s): sampling again", key, out,
                            "; ".join(diffs))
                on_main(shutil.rmtree, out)
            elif os.path.isdir(out):
                log.info("CEA sample %s: resuming the interrupted sample in %s", key, out)
            main, compose = SOURCES[v]
            t0 = time.perf_counter()
            log.info("CEA sample %s: %d samples per question at T = %g", key, options.n_samples, options.temperature)
            results = evaluate(self.config, out, sets, options,
                               checkpoint=train_dir(self.config, main, seed) if main else None,
                               step=want if main else None,
                               compose=(compose[0], train_dir(self.config, compose[1], seed), want)
                               if compose else None)
            scores = {k: r.get("score") for k, r in results["datasets"].items()}
            self._record("sample", key, time.perf_counter() - t0, scores=scores)
            done[key] = scores
            if self.gate == "strict":
                self.check_gate((v,))
        if self.gate == "warn":
            self.check_gate(variants)
        return done

    def _early_b23(self) -> None:
        """Between the single-model variants' samples and the compositions' (about half the sampling): β23,
        the primary, which reads only the former, solved into solve_b23/ (`solve(interference_only=True)`), so
        a study stopped during the compositions still has it. A failure is logged, not raised: sampling goes on."""
        try:
            s = self.solve(interference_only=True)
        except (ValueError, FileNotFoundError) as e:
            log.warning("CEA sample: β23 from the single-model variants not solved yet (%s); sampling the "
                        "compositions", e)
            return
        b = s["coefficients"]["b23"] if isinstance(s.get("coefficients"), dict) else None  # pooled over seeds
        said = f"mean {b['mean']:+.3f} [{b['ci'][0]:+.3f}, {b['ci'][1]:+.3f}]" if b else f"{s['kept']} questions kept"
        log.info("CEA sample: the single-model variants are sampled: β23 solved into %s (%s) before the "
                 "compositions are sampled", os.path.join(self.out, "solve_b23"), said)

    # -- degeneracy gate ---------------------------------------------------------------------------
    def check_gate(self, variants=cea.VARIANTS, collective: bool = True) -> dict | None:
        """The gate over the sampled variants among `variants`, from their saved records (None: gate off);
        read by process 0 (`collective`: shared with every process; else the caller runs on process 0 alone)."""
        if self.gate == "off":
            return None
        sets = from_main(self._gate_sets, variants) if collective else self._gate_sets(variants)
        return dgate.enforce(dgate.study_gate(sets), self.gate, "CEA")

    def _gate_sets(self, variants) -> dict:
        return {run_key(v, s): dgate.eval_records(self.sample_dir(v, s)) for v, s in self.keys(variants)
                if os.path.isfile(os.path.join(self.sample_dir(v, s), "per_question.jsonl"))}

    # -- solve -------------------------------------------------------------------------------------
    def solve(self, interference_only: bool = False) -> dict:
        """β per question from the six sampled variants; with `interference_only`, β23 alone from the
        four single-model variants (writes solve_b23/: for a study whose compositions were not sampled).
        Solved by process 0, its summary returned on every process."""
        return from_main(self._solve, interference_only)

    def _solve(self, interference_only: bool) -> dict:
        c = self.c
        need = cea.SINGLE if interference_only else cea.VARIANTS
        missing = [run_key(v, s) for v, s in self.keys(need)
                   if not os.path.isfile(os.path.join(self.sample_dir(v, s), "results.json"))]
        if missing:
            raise FileNotFoundError(f"CEA solve: variants {missing} have not been sampled under {self.out}/sample "
                                    "(run the sample stage first)")
        gate = self.check_gate(need, collective=False)
        t0 = time.perf_counter()
        if self.seeds != [None]:
            out = os.path.join(self.out, "solve_b23" if interference_only else "solve")
            s = self._solve_seeds(out, need)
            self._record("solve", "b23" if interference_only else "all", time.perf_counter() - t0)
        elif interference_only:
            out = os.path.join(self.out, "solve_b23")
            s = interference_and_report({v: self.sample_dir(v) for v in cea.SINGLE}, out,
                                        int(c.n_boot), int(c.boot_seed), c.title + ": β23 from the four single-model "
                                        "variants")
            self._record("solve", "b23", time.perf_counter() - t0)
        else:
            out = os.path.join(self.out, "solve")
            counts = read_inputs({v: self.sample_dir(v) for v in cea.VARIANTS})
            s = solve_and_report(counts, out, c.estimator, int(c.n_boot), int(c.boot_seed), c.title)
            self._record("solve", "all", time.perf_counter() - t0)
        if gate is not None:
            dgate.add_to_report(out, gate)
            s[dgate.KEY] = gate
        return s

    def _solve_seeds(self, out: str, variants: tuple[str, ...] = cea.VARIANTS) -> dict:
        """Each seed's six variants solved alone (out/s<seed>/, with its figures), then pooled over the
        seeds (analysis.cea_seeds: the seeds × questions interval, decided questions, the seed noise floor,
        the lab's cells) into out/summary.json and out/report.md. `variants` = cea.SINGLE: β23 alone, from
        the four single-model variants (before, or without, the compositions' samples)."""
        from dart_jax.analysis import cea_seeds
        c = self.c
        counts, per_seed = {}, {}
        for seed in self.seeds:
            dirs = {v: self.sample_dir(v, None if v == "base" else seed) for v in variants}
            counts[seed] = read_inputs(dirs, variants)
            title = f"{c.title} (training seed {seed})"
            if variants == cea.VARIANTS:
                s = solve_and_report(counts[seed], os.path.join(out, f"s{seed}"), c.estimator, int(c.n_boot),
                                     int(c.boot_seed), title)
            else:
                s = interference_and_report(dirs, os.path.join(out, f"s{seed}"), int(c.n_boot), int(c.boot_seed),
                                            title + ": β23 from the four single-model variants")
            per_seed[seed] = {"kept": s["kept"], "b23": s[c.estimator]["b23"]}
        s = cea_seeds.pooled(counts, c.estimator, int(c.n_boot), int(c.boot_seed), cells=lab_cells(c.datasets))
        per_question = s.pop("per_question")
        s["per_seed"] = per_seed
        s["role_skills"] = self._role_skills(variants)
        with open(os.path.join(out, "per_question_seeds.jsonl"), "w") as f:
            f.writelines(json.dumps(r) + "\n" for r in per_question)
        with open(os.path.join(out, "summary.json"), "w") as f:
            json.dump(s, f, indent=2)
        with open(os.path.join(out, "report.md"), "w") as f:
            f.write(cea_seeds.report_markdown(s, c.title) + cea_seeds.skills_markdown(s["role_skills"])
                    + "\nEach seed alone: " + ", ".join(f"[seed {x}](s{x}/report.md)" for x in self.seeds) + ".\n")
        return s

    def _role_skills(self, variants: tuple[str, ...] = cea.VARIANTS) -> dict:
        """{sample: {set: the lab's pooled role skills}} from each sample's results (lab sets only)."""
        out = {}
        for v, seed in self.keys(variants):
            with open(os.path.join(self.sample_dir(v, seed), "results.json")) as f:
                sets = json.load(f)["datasets"]
            lab = {d: {k.split("/", 1)[1]: x for k, x in r["lab"]["pooled"].items()} for d, r in sets.items()
                   if r.get("lab", {}).get("pooled")}
            if lab:
                out[run_key(v, seed)] = lab
        return out
