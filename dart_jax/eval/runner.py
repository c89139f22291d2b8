"""The evaluation loop: the training agent, tools and rewards, on the paper's evaluation sets.

    for each dataset: the first `limit` questions (SQL: those whose database exists; the others are
    counted as skipped, never scored 0; gold queries that fail are skipped and counted too, and so
    are questions whose prompt leaves less than one turn of the model's context: rollout.tasks.overlong)
        n samples per question (greedy: 1, temperature 0 → argmax at every step)
        batched rollouts through Agent (sampler + KV-cache resume + retrieval / SQLite)
        score each trajectory: QA EM of the last <answer> + retrieval accuracy; SQL EX of the last
        <solution> (test-suite semantics for Spider, BIRD semantics for BIRD)
    per-trajectory records → per_question.jsonl; per-question accuracy (n-samples mode, CEA's input)
    → per_question_accuracy.jsonl; summaries per dataset and per group → results.{md,csv,json}
"""

from __future__ import annotations

import dataclasses
import json
import time

import jax
import numpy as np

from dart_jax.eval.datasets import EVAL_SETS, GROUPS, EvalSet, load_set
from dart_jax.lab.metrics import degeneracy_gate, per_cell, role_skills
from dart_jax.rewards.qa import em, extract_answer, retrieval_correct, retrieval_hit
from dart_jax.rewards.sql import execution_match, extract_solution, remove_distinct
from dart_jax.rollout.agent import Agent, RolloutConfig
from dart_jax.rollout.compose import compose_rollout, rollout_policy
from dart_jax.rollout.sampling import SamplingConfig
from dart_jax.rollout.tasks import fitting_rows, qa_task, sql_task
from dart_jax.tools.sqlite_exec import execute

SQL_MEAN = "Avg (these sets)"


@dataclasses.dataclass(frozen=True)
class EvalOptions:
    n_samples: int = 1
    temperature: float = 0.0   # 0 = greedy
    top_p: float = 1.0
    top_k: int = 0
    batch: int = 16            # trajectories per rollout batch
    seed: int = 0
    limit: int | None = None   # first N questions of each set
    db_root: str | None = None
    sql_timeout_s: float = 30.0
    keep_distinct: bool = True  # Spider EX: run DISTINCT as written; False = test-suite's default (deleted from both)
    progress: bool = True

    def __post_init__(self):
        if self.n_samples < 1:
            raise ValueError(f"n_samples must be ≥ 1, got {self.n_samples}")
        if self.n_samples > 1 and self.temperature == 0:
            raise ValueError("n_samples > 1 with temperature 0: greedy samples are identical; sample at a "
                             "temperature (the paper's CEA uses 1.0)")
        if self.batch < 1:
            raise ValueError(f"batch must be ≥ 1, got {self.batch}")


def score_qa(text: str, golds: list[str], observed: list[str] | None = None) -> dict:
    """`text`: a trajectory's reward text (observation bodies blanked); `observed`: the bodies it received,
    which retrieval accuracy reads (None: the text's own <information> blocks)."""
    answer = extract_answer(text)
    hit = retrieval_correct(text, golds) if observed is None else retrieval_hit(observed, golds)
    return {"answer": answer, "score": em(answer, golds), "retrieval_hit": bool(hit)}


def distinct_kept(keep_distinct: bool, semantics: str) -> bool:
    """Whether queries run with their DISTINCT: deleting it is test-suite's (Spider) convention only."""
    return keep_distinct or semantics != "spider"


def score_sql(text: str, db_path: str, gold_sql: str, semantics: str, timeout_s: float,
              keep_distinct: bool = True) -> dict:
    solution = extract_solution(text)
    if solution is None:
        return {"solution": None, "score": 0.0, "error": "no <solution>"}
    ok, details = execution_match(db_path, solution, gold_sql, semantics, timeout_s,
                                  keep_distinct=distinct_kept(keep_distinct, semantics))
    return {"solution": solution, "score": float(ok), "error": details.get("error")}


class Evaluator:
    def __init__(self, cfg, tokenizer, protocol, tool_fn, rollout: RolloutConfig, router_convention: str,
                 options: EvalOptions, mesh=None, set_tools: dict | None = None):
        """`mesh`: where rollouts run — in a multi-process run this process's sub-mesh
        (parallel.distributed.local_mesh), each process sampling whole batches on its own devices.
        `set_tools`: {set name: tool} for the sets searched over their own corpus (EvalSet.corpus);
        every other set uses `tool_fn`."""
        self.tok, self.protocol, self.options, self.tool_fn = tokenizer, protocol, options, tool_fn
        self.set_tools = dict(set_tools or {})
        sampling = SamplingConfig(temperature=options.temperature, top_p=options.top_p, top_k=options.top_k)
        self.agent = Agent(cfg, tokenizer, protocol, tool_fn, sampling, rollout, router_convention, mesh=mesh)

    # -- data ------------------------------------------------------------------------------------
    def load(self, s: EvalSet) -> tuple[list[dict], dict]:
        rows, counts = load_set(s, self.options.limit, self.options.db_root)
        counts["skipped_gold_error"] = 0
        if s.task == "sql":  # a gold query that fails cannot score anything: skip and count it
            good = []
            for r in rows:
                kept = distinct_kept(self.options.keep_distinct, s.semantics)
                gold = r["query"] if kept else remove_distinct(r["query"])
                if execute(r["db_path"], gold, self.options.sql_timeout_s, 100_000).ok:
                    good.append(r)
                else:
                    counts["skipped_gold_error"] += 1
            rows = good
            counts["questions"] = len(rows)
        # a question whose prompt leaves less than one turn of the model's context (rollout.tasks.overlong)
        # is skipped before any forward and counted
        context = self.agent.spec.model.max_position_embeddings
        rows, counts["skipped_overlong"] = fitting_rows(self.tok, s.task, rows, context, self.agent.rc)
        if counts["skipped_overlong"]:
            counts["questions"] = len(rows)
        return rows, counts

    # -- rollouts ----------------------------------------------------------------------------------
    def run(self, sets: list[EvalSet], base, adapters, records_path: str | None = None,
            composition: tuple | None = None, earlier: dict | None = None,
            on_plan=None) -> dict:
        """`composition`: (reasoning, tool) rollout.compose.Policy pair — the two-model composition
        (CEA's H_Tool / H_Reas) instead of one policy (`base`, `adapters` are then unused).
        `earlier`: {set: (planned items, records)} of an earlier run with the same setup (eval.resume):
        the batches it sampled that this run would sample identically are reused, not sampled.
        `on_plan({set: items})` is called once the sets are loaded, before any sampling."""
        self.composition = composition
        from tqdm.auto import tqdm

        from dart_jax.eval.resume import reusable, write_records
        from dart_jax.parallel.distributed import from_main
        # process 0 loads (an SQL gold query that times out on one loaded host must not on another)
        loaded = [(s, *from_main(self.load, s)) for s in sets]
        n, b = self.options.n_samples, self.options.batch
        items = {s.name: [(r, k) for r in rows for k in range(n)] for s, rows, _ in loaded}
        kept = {name: reusable(its, (earlier or {}).get(name), b) for name, its in items.items()}
        self.resumed = {name: len(recs) for name, recs in kept.items() if recs}
        out = None
        if records_path:  # what is reused is rewritten first (atomically), new batches appended
            write_records(records_path, [r for recs in kept.values() for r in recs])
            out = open(records_path, "a")
        if on_plan:  # after the records: the plan never describes records of another plan
            on_plan({name: len(its) for name, its in items.items()})
        bar = tqdm(total=sum(len(its) for its in items.values()), desc="evaluate", unit="traj",
                   disable=not self.options.progress or jax.process_index() != 0)
        bar.update(sum(self.resumed.values()))
        results, done = {}, {}
        try:
            for s, rows, counts in loaded:
                t0 = time.perf_counter()
                self.agent.take_phases()
                done[s.name] = self._run_set(s, items[s.name], kept[s.name], base, adapters, bar, out)
                results[s.name] = summarize(s, rows, done[s.name], counts, n, time.perf_counter() - t0)
                # where this set's rollouts spent their time (this process's batches; rollout.agent.take_phases)
                results[s.name]["phases"] = {k: round(v, 3) for k, v in self.agent.take_phases().items()}
        finally:
            bar.close()
            if out:
                out.close()
        if records_path and self.resumed:  # each set's records together, in item order
            write_records(records_path, [r for name in items for r in done[name]])
        return results

    def _run_set(self, s: EvalSet, items: list[tuple[dict, int]], kept: list[dict], base, adapters, bar,
                 out) -> list[dict]:
        """The batches not kept, in rounds of one batch per process (parallel.distributed.rounds: a
        batch is the same batch, with the same seed, on any number of processes), each round's records
        gathered in batch order on every process; `out` (process 0's) gets them appended."""
        if self.agent.rc.engine == "continuous":
            from dart_jax.serve.rollouts import engine_fits  # a low memory-map limit: batch, warned
            if engine_fits(self.agent.spec.model.num_layers, "rollout.engine"):
                return self._run_set_continuous(s, items, kept, base, adapters, bar, out)
        from dart_jax.parallel.distributed import gather_results, mine, rounds
        b = self.options.batch
        recs = list(kept)
        for round_ in rounds(list(range(len(kept), len(items), b))):
            start = mine(round_)
            for part in gather_results(lambda: [] if start is None else  # noqa: B023 (called at once)
                                       self._batch(s, items[start:start + b], start, base, adapters)):
                recs.extend(part)
                if out:
                    out.write("".join(json.dumps(r, ensure_ascii=False) + "\n" for r in part))
            if out:
                out.flush()
            bar.update(min(len(items), round_[-1] + b) - round_[0])
            bar.set_postfix({s.name: f"{np.mean([r['score'] for r in recs]):.3f}"})
        return recs

    def _run_set_continuous(self, s: EvalSet, items: list[tuple[dict, int]], kept: list[dict], base, adapters,
                            bar, out) -> list[dict]:
        """rollout.engine=continuous: the items not kept as requests to one engine of `batch` rows
        (serve.rollouts), each drawing as it would in its batch (the batch's seed, its row); records
        are written in item order as soon as every earlier item's is (what resume reads back)."""
        from dart_jax.serve.rollouts import check_engine, continuous_rollouts
        check_engine(self.agent, getattr(self, "composition", None), jax.process_count(), base)
        b, first = self.options.batch, len(kept)
        todo = items[first:]
        if not todo:
            return list(kept)
        prompts, uids, metas = self._prompts(s, todo)
        tool = self._set_tool(s)
        draws = [(self.options.seed + hash_seed(s.name, j - j % b), j % b) for j in range(first, len(items))]
        recs, done, written = list(kept), {}, 0
        for i, tb in continuous_rollouts(self.agent, base, adapters, prompts, uids, metas, draws, b, tool):
            done[i] = self._record(s, *todo[i], tb, 0)
            bar.update(1)
            while written in done:
                rec = done.pop(written)
                recs.append(rec)
                written += 1
                if out:
                    out.write(json.dumps(rec, ensure_ascii=False) + "\n")
            if out:
                out.flush()
            bar.set_postfix({s.name: f"{np.mean([r['score'] for r in recs]):.3f}" if recs else "-"})
        return recs

    def _prompts(self, s: EvalSet, chunk: list[tuple[dict, int]]) -> tuple[list, list, list[dict]]:
        task_fn = qa_task if s.task == "qa" else sql_task
        prompts, uids, metas = task_fn(self.tok, [r for r, _ in chunk], self.agent.rc.prompt_tags)
        metas = [dict(m, uid=r["id"], sample=k, question=r["question"], db_id=r.get("db_id", ""))
                 for m, (r, k) in zip(metas, chunk)]
        return prompts, uids, metas

    def _set_tool(self, s: EvalSet):
        tool = self.set_tools.get(s.name, self.tool_fn)
        self.agent.tool = tool  # this set's tool (a lab world's questions: its own world's corpus)
        if hasattr(tool, "reset"):
            tool.reset()
        return tool

    def _batch(self, s: EvalSet, chunk: list[tuple[dict, int]], start: int, base, adapters) -> list[dict]:
        prompts, uids, metas = self._prompts(s, chunk)
        self._set_tool(s)
        seed = self.options.seed + hash_seed(s.name, start)
        if getattr(self, "composition", None):
            tb = compose_rollout(self.agent, *self.composition, prompts, uids, metas, seed=seed)
        else:
            tb = rollout_policy(self.agent, base, adapters, prompts, uids, metas, seed=seed)
        return [self._record(s, row, k, tb, i) for i, (row, k) in enumerate(chunk)]

    def _record(self, s: EvalSet, row: dict, sample: int, tb, i: int) -> dict:
        text = tb.reward_text[i]  # scored: the model's own spans (rollout.trajectory); the record keeps it all
        calls = [{"query": t["query"], "observation": t["observation"]} for t in tb.turns[i] if t["action"] == "tool"]
        rec = {"dataset": s.name, "id": row["id"], "sample": sample, "question": row["question"]}
        if s.name in self.set_tools:  # searched over the set's own corpus, not the run's retriever
            rec["corpus"] = s.corpus
        if s.task == "qa":
            rec["golden_answers"] = row["golden_answers"]
            rec.update(score_qa(text, row["golden_answers"], tb.observed[i]))
        else:
            rec.update(db_id=row["db_id"], gold_sql=row["query"])
            rec.update(score_sql(text, row["db_path"], row["query"], s.semantics, self.options.sql_timeout_s,
                                 self.options.keep_distinct))
        rec.update(finish=tb.finish_reason[i], tool_calls=calls, turns=len(tb.turns[i]),
                   response_tokens=int(tb.length[i] - tb.prompt_len[i]), response=tb.response_text[i])
        return rec


def hash_seed(name: str, start: int) -> int:
    """A seed per (dataset, batch) that does not depend on Python's string hashing."""
    return (sum((k + 1) * ord(c) for k, c in enumerate(name)) * 1_000_003 + start) % (2 ** 31 - 1)


def summarize(s: EvalSet, rows: list[dict], recs: list[dict], counts: dict, n: int, seconds: float) -> dict:
    scores = np.asarray([r["score"] for r in recs], np.float64)
    finish = [r["finish"] for r in recs]
    out = {"name": s.name, "label": s.label, "task": s.task, "metric": "EM" if s.task == "qa" else "EX",
           "questions": len(rows), "trajectories": len(recs), "samples_per_question": n,
           "score": float(scores.mean()) if len(recs) else float("nan"),
           "answer_rate": float(np.mean([f == "answer" for f in finish])) if recs else float("nan"),
           "invalid_rate": float(np.mean([f == "invalid" for f in finish])) if recs else float("nan"),
           "tool_calls": float(np.mean([len(r["tool_calls"]) for r in recs])) if recs else float("nan"),
           "response_tokens": float(np.mean([r["response_tokens"] for r in recs])) if recs else float("nan"),
           "skipped_no_db": int(counts.get("skipped_no_db", 0)),
           "skipped_gold_error": int(counts.get("skipped_gold_error", 0)),
           "skipped_overlong": int(counts.get("skipped_overlong", 0)), "seconds": round(seconds, 1)}
    if s.task == "qa":
        out["retrieval_acc"] = float(np.mean([r["retrieval_hit"] for r in recs])) if recs else float("nan")
    if s.task == "sql":
        out["semantics"] = s.semantics
    if s.in_distribution:
        out["in_distribution"] = True  # left out of the group means (group_scores)
    if any(r.get("lab") for r in rows):
        out["lab"] = lab_summary(recs, rows)
    if n > 1:
        per_q = per_question_accuracy(recs)
        acc = np.asarray([q["accuracy"] for q in per_q])
        out["pass_at_n"] = float(np.mean(acc > 0)) if len(acc) else float("nan")
        out["never_correct"] = float(np.mean(acc == 0)) if len(acc) else float("nan")
    return out


def lab_summary(recs: list[dict], rows: list[dict]) -> dict:
    """A lab set's role skills (lab.metrics): pooled ("lab/tool_skill", ...), per (hops, op) cell
    ("h2_compare": {...}) and the degeneracy gate's reasons on the pooled metrics ([]: passed)."""
    pooled = role_skills(recs, rows)
    cells = {f"h{h}_{op}": m for (h, op), m in per_cell(recs, rows).items()}
    return {"pooled": pooled, "cells": cells, "gate": degeneracy_gate(pooled)}


def per_question_accuracy(recs: list[dict]) -> list[dict]:
    """One line per question: n samples, correct count, accuracy (CEA's s_q^M)."""
    by_q: dict = {}
    for r in recs:
        q = by_q.setdefault((r["dataset"], r["id"]), {"dataset": r["dataset"], "id": r["id"],
                                                      "question": r["question"], "n": 0, "correct": 0.0})
        q["n"] += 1
        q["correct"] += r["score"]
    return [dict(q, accuracy=q["correct"] / q["n"]) for q in by_q.values()]


def group_scores(task: str, results: dict) -> dict:
    """QA: Gen-Avg / MH-Avg / Avg, each only when all its datasets were evaluated. SQL: the mean over
    the held-out benchmarks evaluated, named so it is not mistaken for the paper's six-benchmark Avg;
    an in-distribution probe (`EvalSet.in_distribution`: a run's own training questions) is left out."""
    score = {k: v["score"] for k, v in results.items()
             if v["trajectories"] and not v.get("in_distribution", k in EVAL_SETS and EVAL_SETS[k].in_distribution)}
    if task == "sql":
        return {SQL_MEAN: float(np.mean(list(score.values())))} if score else {}
    return {g: float(np.mean([score[m] for m in members])) for g, members in GROUPS.items()
            if all(m in score for m in members)}


def write_per_question_accuracy(records_path: str, out_path: str) -> int:
    with open(records_path) as f:
        recs = [json.loads(line) for line in f if line.strip()]
    rows = per_question_accuracy(recs)
    with open(out_path, "w") as f:
        for r in rows:
            f.write(json.dumps(r, ensure_ascii=False) + "\n")
    return len(rows)
