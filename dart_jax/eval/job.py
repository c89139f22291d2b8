"""`launch.evaluate` as a function: load the policy, build the tool, run the sets, write the reports."""

from __future__ import annotations

import dataclasses
import logging
import os
import time

import jax

from dart_jax.adapters.method import TwoModels
from dart_jax.data.paths import repo_path
from dart_jax.errors import UserError
from dart_jax.eval import paper, resume
from dart_jax.eval.datasets import EvalSet, default_sets, ids_digest, resolve
from dart_jax.eval.fixed import FixedRetrieval
from dart_jax.eval.policy import load_eval_policy
from dart_jax.eval.report import write_reports
from dart_jax.eval.runner import (
    EvalOptions,
    Evaluator,
    group_scores,
    write_per_question_accuracy,
)
from dart_jax.models.transformer import unstack_layers
from dart_jax.parallel.distributed import allgather_objects, from_main, is_main, local_mesh, local_view, on_main
from dart_jax.rollout.agent import trajectory_settings
from dart_jax.rollout.compose import Policy as CPolicy
from dart_jax.rollout.protocol import PROTOCOLS
from dart_jax.run.policy import run_mesh
from dart_jax.run.spec import run_spec
from dart_jax.run.task import build_tool

log = logging.getLogger(__name__)


def policy_name(source: dict) -> str:
    name = os.path.basename(os.path.normpath(source["model"]))
    if source.get("variant") == "warm_start" or (source.get("warm_start") and source.get("variant") == "base"):
        name += " + warm start"
    if source.get("adapters") or source.get("checkpoint"):
        where = source.get("adapters") or f"{source['checkpoint']}@{source.get('step')}"
        name += f" + {source.get('variant', 'dart')} ({where})"
    if source.get("peft"):
        name += f" + PEFT ({source['peft']})"
    if source.get("removed"):
        name += f" − {source['removed']} adapter"
    return name


def architecture(cfg) -> str:
    """The evaluated model's shape in words, for the report's header (vocabulary with the tags)."""
    return f"{cfg.model_type}, {cfg.num_layers} layers, hidden {cfg.hidden_size}, vocabulary {cfg.vocab_size}"


def evaluate(config, out_dir: str, datasets: list[str] | None = None, options: EvalOptions = EvalOptions(),
             checkpoint: str | None = None, peft: str | None = None, remove: str | None = None,
             step: int | None = None, fixed_retrieval: str | None = None,
             compare: list[str] | None = None, compose: tuple[str, str] | None = None,
             resume_run: bool = True, as_trained: dict | None = None, strict_gate: bool = False) -> dict:
    """-> results (also written to out_dir: results.{md,csv,json}, per_question.jsonl and, with
    n_samples > 1, per_question_accuracy.jsonl).

    `compose` = (role, checkpoint[, step]): a two-model composition (rollout.compose) in which the policy
    loaded from `checkpoint` writes `role`'s tokens ("tool": the tool spans; "reasoning": all else)
    and the main policy (`checkpoint` / `peft` / the base model) writes the other role's — CEA's
    H_Tool is the base model with ("tool", M_Tool), H_Reas the base model with ("reasoning", M_Reas).

    `resume_run`: when out_dir holds an evaluation with the same setup (all but `limit`), the batches
    it sampled are reused and only the rest is sampled (eval.resume: the result is the same as one
    uninterrupted run); setup["resumed"] counts what was reused.

    `as_trained` = {"run": directory, "records": [files read], "overrides": ["field: run's X → Y (from
    FLAG)", ...]}: the config was taken from that run (eval.as_trained); the report's header says so
    and lists the overrides.

    A set with a corpus (EvalSet.corpus: the lab's worlds) is searched over that corpus by the run's
    retriever kind, not over the run's server / index (setup["corpora"] and its records say so); a lab
    set's results carry its role skills pooled and per (hops, op) cell and the degeneracy gate's verdict
    (`strict_gate`: a flagged set is a UserError once the reports are written, else a warning)."""
    spec = run_spec(config)
    task = spec.task
    if task not in PROTOCOLS:
        raise ValueError(f"task {task!r}; expected one of {sorted(PROTOCOLS)}")
    sets = resolve(datasets or default_sets(task, options.db_root), task)
    compare_keys = [list(_paper_key(c, task)) for c in compare or ()]
    protocol = PROTOCOLS[task]
    mesh = run_mesh(spec)
    lmesh = local_mesh(mesh)  # multi-process: each process samples whole batches on its own devices
    policy = _decode_ready(spec, load_eval_policy(spec, mesh, checkpoint, peft, remove, step, options.seed), lmesh)
    composition = None
    if compose:
        role, other_dir, other_step = (*compose, None) if len(compose) == 2 else compose
        if role not in ("reasoning", "tool"):
            raise ValueError(f"compose role {role!r}; expected 'reasoning' or 'tool'")
        if isinstance(policy.base, TwoModels):
            raise ValueError("compose: the main policy is already a 2-Agent pair of models; compose single models")
        other = _decode_ready(spec, load_eval_policy(spec, mesh, other_dir, None, None, other_step, options.seed),
                              lmesh)
        if other.tokenizer.get_vocab() != policy.tokenizer.get_vocab():
            raise ValueError(f"compose: {other_dir}'s tokenizer differs from the main policy's; a composition "
                             "shares one token stream")
        conv = lambda p: p.router_convention or spec.router_convention  # noqa: E731
        if conv(other) != conv(policy):
            raise ValueError(f"compose: {other_dir} routes its adapters by the {conv(other)!r} router convention and "
                             f"the main policy by {conv(policy)!r}; one trajectory is routed one way")
        pair = {role: other, ("tool" if role == "reasoning" else "reasoning"): policy}
        composition = tuple(CPolicy(p.cfg, p.base, p.adapters, p.route_mode if p.adapters else "none")
                            for p in (pair["reasoning"], pair["tool"]))
    searched = {} if fixed_retrieval or task != "qa" else {s.name: searched_over(s, spec) for s in sets if s.corpus}
    set_tools = set_corpus_tools(spec, protocol, sets, searched)
    if fixed_retrieval:
        tool = FixedRetrieval(repo_path(fixed_retrieval), protocol)
    elif all(s.name in set_tools for s in sets):
        tool = None  # every set is searched over its own corpus: the run's retriever is never asked
    else:
        tool = build_tool(spec, protocol)
    rollout = dataclasses.replace(spec.rollout, route_mode=policy.route_mode)
    convention = policy.router_convention or spec.router_convention
    evaluator = Evaluator(policy.cfg, policy.tokenizer, protocol, tool, rollout, convention, options, mesh=lmesh,
                          set_tools=set_tools)
    variant = policy.source.get("variant")
    p_method = paper.method_key(task, variant, int(spec.method.rank)) if variant in ("dart", "lora", "full") else None
    setup = {"task": task, "policy": policy_name(policy.source), **{k: v for k, v in policy.source.items()},
             "n_samples": options.n_samples, "temperature": options.temperature, "top_p": options.top_p,
             "top_k": options.top_k, "limit": options.limit, "seed": options.seed, "batch": options.batch,
             "fixed_retrieval": fixed_retrieval or "", "rollout": trajectory_settings(_settings(spec.rollout)),
             "router_convention": convention,
             "retriever": _settings(spec.retriever) if task == "qa" and not fixed_retrieval else {},
             "paper_model": paper.model_key(spec.model.path), "paper_method": p_method,
             "devices": f"{jax.device_count()} × {jax.devices()[0].platform}", "seconds": 0.0,
             "processes": jax.process_count(),
             "model_config": _settings(spec.model), "mesh": list(spec.mesh.shape),
             "architecture": architecture(policy.cfg),
             **({"as_trained": as_trained} if as_trained else {}),
             "db_root": options.db_root or "", "sql_timeout_s": options.sql_timeout_s,
             **({} if options.keep_distinct or task != "sql" else {"keep_distinct": False}),
             "files": resume.stamps(policy.source, fixed_retrieval),
             # the sets searched over their own corpus instead of the run's retriever (resume compares them
             # per set: a set's records are reused only when it was searched over the same corpus)
             **({"corpora": searched} if searched else {}),
             # sets narrowed to chosen questions (a CEA screen): their ids' digest, so another selection is
             # never resumed from these records
             **({"selected": {s.name: ids_digest(s.ids) for s in sets if s.ids is not None}}
                if any(s.ids is not None for s in sets) else {}),
             # rewards read the model's spans only (rollout.trajectory.reward_views): records scored
             # before that read observation text too, and are not reused
             "scoring": "model_spans"}
    if compose:
        setup["composition"] = {"role": compose[0], "checkpoint": compose[1], "step": other.source.get("step"),
                                "variant": other.source.get("variant"), "other_role_by": setup["policy"],
                                "mode": "two models, append-only hand-offs (rollout.compose)"}
        setup["policy"] = f"{compose[0]} by {compose[1]}, {'tool' if compose[0] == 'reasoning' else 'reasoning'} " \
                          f"by {setup['policy']}"
    records = os.path.join(out_dir, "per_question.jsonl")
    # files are read and written by process 0 (the others roll out their batches and gather)
    earlier = from_main(_prepare, out_dir, setup, options.batch, resume_run)
    t0 = time.perf_counter()
    main = is_main()
    per_set = evaluator.run(sets, policy.base, policy.adapters, records if main else None, composition, earlier,
                            on_plan=(lambda items: resume.write_progress(out_dir, setup, options.batch, items))
                            if main else None)
    if evaluator.resumed:
        setup["resumed"] = evaluator.resumed
        log.info("evaluate: reused %s trajectories sampled earlier in %s", evaluator.resumed, out_dir)
    for name, where in searched.items():
        per_set[name]["corpus"] = where["corpus"]
    results = {"setup": setup, "datasets": per_set, "groups": group_scores(task, per_set)}
    if fixed_retrieval:
        from collections import Counter
        results["fixed_retrieval_stats"] = dict(sum((Counter(c) for c in allgather_objects(dict(tool.stats))),
                                                    Counter()))  # every process's calls
    setup["seconds"] = round(time.perf_counter() - t0, 1)
    files = {"per_question": records}
    if options.n_samples > 1:
        files["per_question_accuracy"] = os.path.join(out_dir, "per_question_accuracy.jsonl")
        on_main(write_per_question_accuracy, records, files["per_question_accuracy"])
    results["files"] = files
    setup["compare"] = compare_keys
    results["files"].update(from_main(write_reports, out_dir, results))
    gate_verdicts(results, strict_gate)
    return results


def gate_verdicts(results: dict, strict: bool = False) -> dict[str, list[str]]:
    """The degeneracy gate (lab.metrics.degeneracy_gate) of each lab set's pooled role skills, as the
    results record it: a loud warning per flagged set, or with `strict` one UserError naming them all
    (after the reports are written, so what was measured stays on disk). -> {set: reasons}."""
    flagged = {name: d["lab"]["gate"] for name, d in results["datasets"].items() if d.get("lab", {}).get("gate")}
    if not flagged:
        return {}
    lines = [f"{name}: " + "; ".join(reasons) for name, reasons in flagged.items()]
    if strict:
        raise UserError("degeneracy gate (--strict-gate): " + " | ".join(lines) + " — these sets measure a template, "
                        "not the role skills; fix the warm start / retriever, or drop --strict-gate to only flag it "
                        f"(results written to {results['files'].get('markdown', 'the output directory')})")
    if is_main():
        for line in lines:
            log.warning("!!! degeneracy gate: %s !!! (its role skills measure a template, not skills)", line)
    return flagged


def searched_over(s: EvalSet, spec) -> dict:
    """What a set with a corpus is searched over: the corpus (its path as the set names it, and a stamp of
    the file), by the run's retriever kind (with its encoder when dense) and top-k — the run's server URL
    or index directory are not asked for it."""
    path = s.corpus_path()
    if not os.path.isfile(path):
        raise UserError(f"dataset {s.name}: its corpus {path} is missing (python -m launch.lab_build writes the "
                        "lab's worlds under data/lab/)")
    rc = spec.retriever
    if s.group == "lab" and rc.kind != "lexical" and is_main():
        log.warning("evaluate: %s is searched over %s by the %s retriever; the lab's results are measured with the "
                    "lexical one (docs/results/lab.md): --config.retriever.kind=lexical", s.name, s.corpus, rc.kind)
    out = {"corpus": s.corpus, "kind": rc.kind, "topk": int(rc.topk), "file": resume.stamps({}, path).get(path)}
    if rc.kind != "lexical":
        out["encoder"] = rc.encoder
    return out


def set_corpus_tools(spec, protocol, sets: list[EvalSet], searched: dict) -> dict:
    """{set: tool} for the sets in `searched`: the run's retriever settings with the set's corpus in place of
    the server URL / index directory / corpus (one tool per distinct corpus, its index built on first use)."""
    tools: dict[str, object] = {}
    by_corpus: dict[str, object] = {}
    for s in sets:
        if s.name not in searched:
            continue
        path = s.corpus_path()
        if path not in by_corpus:
            rc = dataclasses.replace(spec.retriever, url="", index_dir="", corpus=path)
            by_corpus[path] = build_tool(dataclasses.replace(spec, retriever=rc), protocol)
        tools[s.name] = by_corpus[path]
    return tools


def _prepare(out_dir: str, setup: dict, batch: int, resume_run: bool) -> dict:
    """-> what an earlier run in out_dir sampled with this setup (eval.resume), its summaries removed."""
    os.makedirs(out_dir, exist_ok=True)
    earlier = resume.prior(out_dir, setup, batch) if resume_run else {}
    resume.clear_results(out_dir)  # an earlier run's summaries no longer describe the records
    return earlier


def _settings(section) -> dict:
    """A spec section as the report records it (the rollout's route mode is the policy's, not a setting)."""
    return {k: v for k, v in dataclasses.asdict(section).items() if k != "route_mode"}


def _decode_ready(spec, policy, lmesh):
    """With rollout.decode_layout "shared" the evaluated base is held per layer (one tree for every
    rollout batch, no copy: rollout.placement). Multi-process: the trees as seen by this process's
    sub-mesh (parallel.distributed.local_view)."""
    if spec.rollout.decode_layout == "shared" and not isinstance(policy.base, TwoModels):
        policy.base = unstack_layers(policy.base)
    policy.base, policy.adapters = local_view((policy.base, policy.adapters), lmesh)
    return policy


def _paper_key(text: str, task: str) -> tuple[str, str]:
    """'dart,qwen2.5-3b-base' -> a key of the paper table."""
    method, _, model = text.partition(",")
    key = (method.strip(), model.strip())
    if key not in paper.rows_for(task):
        raise ValueError(f"--compare {text!r}: no such paper row; known: "
                         f"{[f'{m},{b}' for m, b in paper.rows_for(task)]}")
    return key
