"""Evaluation reports: a header naming what was evaluated and how (model, retrieval or database tool,
protocol, samples and temperature), the paper-style table, per-dataset details and the side-by-side
with the paper's results tables, as markdown, CSV and JSON."""

from __future__ import annotations

import csv
import json
import math
import os

from dart_jax.analysis.tables import markdown_table
from dart_jax.eval import paper
from dart_jax.eval.datasets import HELDOUT_SETS, LAB_SETS, QA_SETS, SQL_SETS, TRAIN_SETS

# a lab set's pooled role skills (lab.metrics.role_skills, "lab/<name>"), its CSV columns and table heads
LAB_FIELDS = (("trajectories", "trajectories"), ("accuracy", "accuracy"), ("tool_skill", "tool skill"),
              ("reasoning_skill", "reasoning skill"), ("copy_rate", "copy rate"), ("chain_coverage", "chain coverage"),
              ("tool_calls", "tool calls"), ("values_stated", "values stated"), ("distinct_think", "distinct think"),
              ("top_think_share", "top think share"))
CSV_FIELDS = ("name", "label", "task", "metric", "score", "questions", "trajectories", "samples_per_question",
              "answer_rate", "invalid_rate", "tool_calls", "retrieval_acc", "response_tokens", "pass_at_n",
              "never_correct", "skipped_no_db", "skipped_gold_error", "seconds", "corpus",
              *(f"lab/{k}" for k, _ in LAB_FIELDS if k not in ("trajectories", "tool_calls")), "lab/gate")


def _f(v, digits: int = 3) -> str:
    if v is None or (isinstance(v, float) and math.isnan(v)):
        return "—"
    return f"{v:.{digits}f}" if isinstance(v, float) else str(v)


def _columns(task: str, results: dict) -> list[tuple[str, str]]:
    """(key, header) of the paper-style table: the task's datasets in the paper's order (those
    evaluated), then the averages."""
    sets = QA_SETS + LAB_SETS if task == "qa" else SQL_SETS + HELDOUT_SETS + TRAIN_SETS
    cols = [(s.name, s.label) for s in sets if s.name in results["datasets"]]
    return cols + [(g, g) for g in results["groups"]]


def main_table(results: dict) -> str:
    task = results["setup"]["task"]
    cols = _columns(task, results)
    scores = {**{k: v["score"] for k, v in results["datasets"].items()}, **results["groups"]}
    metric = "EM" if task == "qa" else "EX"
    return markdown_table([metric, *(h for _, h in cols)],
                          [[results["setup"]["policy"], *(_f(scores.get(k)) for k, _ in cols)]])


def detail_table(results: dict) -> str:
    task = results["setup"]["task"]
    n = results["setup"]["n_samples"]
    head = ["dataset", "questions", "EM" if task == "qa" else "EX", "answered", "invalid", "tool calls",
            "response tokens"]
    if task == "qa":
        head.append("retrieval acc")
    if n > 1:
        head += [f"pass@{n}", "never correct"]
    head += ["skipped (no DB)", "skipped (gold fails)", "s"]
    rows = []
    for name, r in results["datasets"].items():
        cells = [r["label"], str(r["questions"]), _f(r["score"]), _f(r["answer_rate"], 2), _f(r["invalid_rate"], 2),
                 _f(r["tool_calls"], 2), _f(r["response_tokens"], 0)]
        if task == "qa":
            cells.append(_f(r.get("retrieval_acc")))
        if n > 1:
            cells += [_f(r.get("pass_at_n")), _f(r.get("never_correct"))]
        cells += [str(r["skipped_no_db"]), str(r["skipped_gold_error"]), _f(r["seconds"], 0)]
        rows.append(cells)
    return markdown_table(head, rows)


def paper_table(results: dict) -> str:
    """This run next to the paper's rows. With a matching setup (same backbone and method) the
    matching row comes first with Δ = ours − paper; otherwise the paper rows of the task are listed
    for orientation only and the header says why they are not comparable."""
    setup = results["setup"]
    task = setup["task"]
    table = paper.rows_for(task)
    match = paper.matching(task, setup.get("paper_method"), setup.get("paper_model"))
    compare = [tuple(k) for k in setup.get("compare") or ()]
    keys = compare or ([match] if match else list(table))
    cols = _columns(task, results)
    cols += [(g, g) for g in ("Gen-Avg", "MH-Avg", "Avg") if g not in dict(cols) and any(g in table[p] for p in keys)]
    ours = {**{k: v["score"] for k, v in results["datasets"].items()}, **results["groups"]}
    if match:
        note = (f"Setup matches the paper's {paper.label(match)} (backbone and method); evaluation slices: "
                f"first {setup.get('limit') or 'all'} questions per set.")
    else:
        why = (f"model {setup.get('model')!r}" + ("" if setup.get("paper_model") else " is not a paper backbone"))
        method = setup.get("paper_method") or "none (no trained adapters)"
        note = (f"Setup differs from every paper row ({why}; method {method}): paper rows shown for orientation "
                "only, no deltas.")
    rows = [["this run", *(_f(ours.get(k)) for k, _ in cols)]]
    for key in keys:
        row = table[key]
        rows.append([f"paper: {paper.label(key)}", *(_f(row.get(k)) for k, _ in cols)])
        if key == match:
            rows.append(["Δ (ours − paper)", *((_f(ours[k] - row[k], 3) if k in ours and k in row else "—")
                                                for k, _ in cols)])
    return "\n".join([note, "", markdown_table(["row", *(h for _, h in cols)], rows)])


PROTOCOL_NAMES = {"qa": "Search-R1", "sql": "SkyRL-SQL"}


def _quoted(v) -> str:
    return json.dumps(v, ensure_ascii=False)


def _tool_line(s: dict) -> str:
    """Where observations came from: the retriever (server URL, or index / corpus with its encoder and
    prefixes), the recorded documents of a fixed-retrieval file, or the SQL databases."""
    if s.get("fixed_retrieval"):
        return f"fixed retrieval: the documents recorded in {s['fixed_retrieval']}"
    if s.get("task") == "sql":
        timeout = f", {s['sql_timeout_s']:g} s per query" if s.get("sql_timeout_s") else ""
        where = f"the databases in {s['db_root']}" if s.get("db_root") else "the shipped databases"
        return f"tool: SQLite over {where}{timeout}"
    r = s.get("retriever") or {}
    if not r:
        return "retrieval: not recorded"
    top = f", top-{r['topk']} passages" if r.get("topk") else ""
    if r.get("url"):
        return f"retrieval: the retrieval server at {r['url']}{top}"
    where = f"the index {r['index_dir']}" if r.get("index_dir") else f"the corpus {r.get('corpus')}"
    prefixes = "".join(f", {name} prefix {_quoted(r[key])}" for key, name in (("query_prefix", "query"),
                                                                             ("passage_prefix", "passage"))
                       if r.get(key))
    if not prefixes and "query_prefix" in r:  # "" takes the index's (detected from the encoder)
        prefixes = ", the prefixes the index records"
    return f"retrieval: {where} with the encoder {r.get('encoder')}{prefixes}{top}"


def _corpus_lines(s: dict) -> list[str]:
    """The sets searched over their own corpus (a lab world's questions over that world), not the retriever above."""
    out = []
    for name, c in (s.get("corpora") or {}).items():
        enc = f" with the encoder {c['encoder']}" if c.get("encoder") else ""
        out.append(f"{name}: retrieval over its own corpus {c['corpus']} ({c.get('kind')}{enc}, top-{c.get('topk')} "
                   "passages) instead")
    return out


def lab_tables(results: dict) -> str:
    """Per lab set: the degeneracy gate's verdict, then its role skills pooled ("all") and per (hops, op) cell."""
    parts = []
    for name, d in results["datasets"].items():
        lab = d.get("lab")
        if not lab:
            continue
        gate = lab.get("gate") or []
        verdict = ("degeneracy gate: passed" if not gate else
                   "**degeneracy gate: FLAGGED** — " + "; ".join(gate) + " (these role skills measure a template)")
        where = f", searched over {d['corpus']}" if d.get("corpus") else ""
        rows = [["all", *(_lab_cell(lab["pooled"].get("lab/" + k), k) for k, _ in LAB_FIELDS)]]
        rows += [[cell, *(_lab_cell(m.get("lab/" + k), k) for k, _ in LAB_FIELDS)] for cell, m in lab["cells"].items()]
        parts += [f"### {d['label']}{where}", "", verdict, "",
                  markdown_table(["cell", *(h for _, h in LAB_FIELDS)], rows), ""]
    return "\n".join(parts).rstrip()


def _lab_cell(v, key: str) -> str:
    if key in ("trajectories", "distinct_think") and isinstance(v, float) and not math.isnan(v):
        return str(int(v))
    return _f(v, 2 if key == "tool_calls" else 3)


def _csv_row(r: dict) -> dict:
    row = {k: r.get(k, "") for k in CSV_FIELDS}
    lab = r.get("lab")
    if lab:
        row.update({k: lab["pooled"].get(k, "") for k in CSV_FIELDS if k.startswith("lab/") and k != "lab/gate"})
        row["lab/gate"] = "; ".join(lab["gate"]) if lab["gate"] else "passed"
    return row


def _protocol_line(s: dict) -> str:
    ro = s.get("rollout") or {}
    task = s.get("task")
    name = f"{PROTOCOL_NAMES.get(task, task)} ({task})"
    if not ro:
        return f"protocol: {name}"
    return (f"protocol: {name}, up to {ro.get('max_turns')} tool turns of ≤ {ro.get('max_tokens_per_turn')} tokens, "
            f"observations ≤ {ro.get('max_obs_tokens')} tokens, responses ≤ {ro.get('max_response_tokens')} tokens")


def header(results: dict) -> list[str]:
    """What was evaluated and how, one item per line."""
    s = results["setup"]
    mc = s.get("model_config") or {}
    arch = "; ".join(x for x in (s.get("architecture"),
                                 f"weights {mc['param_dtype']}, compute {mc['compute_dtype']}"
                                 if mc.get("param_dtype") else "") if x)
    n, t = s.get("n_samples", 1), s["temperature"]
    sampling = ("greedy (temperature 0), 1 sample per question" if t == 0 else
                f"{n} sample{'s' if n > 1 else ''} per question at temperature {t:g}"
                + (f" (top-p {s['top_p']:g}" + (f", top-k {s['top_k']})" if s.get("top_k") else ")")
                   if s.get("top_p") is not None else ""))
    lines = [f"- model: {s.get('model', '?')}" + (f" ({arch})" if arch else ""),
             f"- {_tool_line(s)}", *(f"- {x}" for x in _corpus_lines(s)), f"- {_protocol_line(s)}",
             f"- sampling: {sampling}",
             f"- questions: {'first ' + str(s['limit']) + ' of each set' if s.get('limit') else 'all'}"
             + ("; Spider EX with DISTINCT deleted from both queries (test-suite's default)"
                if s.get("keep_distinct") is False and any(d.get("semantics") == "spider"
                                                           for d in results["datasets"].values()) else "")]
    trained = s.get("as_trained")
    if trained:
        records = trained.get("records") or []
        what = (f"as {trained['run']} was trained ({', '.join(records)})" if "run_config.json" in records else
                f"the base model from {', '.join(os.path.join(trained['run'], r) for r in records)}, the rest "
                "configs/evaluate.py's defaults")
        changed = trained.get("overrides") or []
        lines.append(f"- settings: {what}" + (", except " + "; ".join(changed) if changed else ""))
    return lines


def markdown(results: dict) -> str:
    s = results["setup"]
    parts = [f"# Evaluation: {s['policy']}", "", *header(results), "",
             main_table(results), "", "## Per dataset", "", detail_table(results), "",
             "## Against the paper", "", paper_table(results)]
    lab = lab_tables(results)
    if lab:
        parts += ["", "## Lab role skills (dart_jax/lab/metrics.py)", "", lab]
    if results.get("fixed_retrieval_stats"):
        parts += ["", "Fixed retrieval: " + ", ".join(f"{k} {v}" for k, v in results["fixed_retrieval_stats"].items())]
    return "\n".join(parts) + "\n"


def write_reports(out_dir: str, results: dict) -> dict[str, str]:
    os.makedirs(out_dir, exist_ok=True)
    paths = {"markdown": os.path.join(out_dir, "results.md"), "csv": os.path.join(out_dir, "results.csv"),
             "json": os.path.join(out_dir, "results.json")}
    with open(paths["markdown"], "w") as f:
        f.write(markdown(results))
    with open(paths["csv"], "w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=CSV_FIELDS, extrasaction="ignore")
        w.writeheader()
        for r in results["datasets"].values():
            w.writerow(_csv_row(r))
        for g, v in results["groups"].items():
            w.writerow({"name": g, "label": g, "task": results["setup"]["task"],
                        "metric": "EM" if results["setup"]["task"] == "qa" else "EX", "score": v})
    with open(paths["json"], "w") as f:
        json.dump(results, f, indent=2, ensure_ascii=False)
    return paths
