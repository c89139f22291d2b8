"""The method comparison's report: held-out EM per method (each seed's count with its Wilson interval,
the mean and the spread over seeds), training reward curves overlaid, step time and memory per
method, and the paper's 3B-Base numbers beside them for orientation (a different backbone, corpus
and budget: never a comparison). The runs answer the same questions, so differences are also paired
question by question: each run against the warm start every run starts from (what GRPO gained and
lost) and DART against each other method of the same seed, with the exact McNemar test (a two-sided
binomial test on the discordant questions)."""

from __future__ import annotations

import csv
import json
import os
import statistics

import numpy as np

from dart_jax.analysis.tables import markdown_table
from dart_jax.eval.paper import METHOD_NAMES, PAPER_QA
from dart_jax.run.metrics import read_metrics, wilson_interval
from dart_jax.run.records import read_records

PAPER_KEY = {"dart": "dart", "lora16": "lora16", "full": "search_r1", "mixlora": "mixlora", "2agent": "2agent"}


def _outcomes(eval_dir: str, datasets: list[str]) -> dict:
    """{(dataset, question id): correct} from an evaluation's per_question.jsonl (greedy: one record each;
    per_question.jsonl.gz in an archived evaluation; a last line cut short by a crash skipped, logged)."""
    out = {}
    path = os.path.join(eval_dir, "per_question.jsonl")
    for r in read_records(path if os.path.isfile(path) else path + ".gz"):
        if r["dataset"] in datasets:
            out[(r["dataset"], str(r["id"]))] = bool(r["score"] > 0)
    return out


def paired(a: dict, b: dict, dataset: str) -> dict:
    """Questions of `dataset` both evaluations answered: right only in a, right only in b, right in both,
    questions, and the exact McNemar p (two-sided binomial on the discordant pairs; 1 when none)."""
    from scipy.stats import binomtest
    keys = [k for k in a if k[0] == dataset and k in b]
    only_a = sum(a[k] and not b[k] for k in keys)
    only_b = sum(b[k] and not a[k] for k in keys)
    both = sum(a[k] and b[k] for k in keys)
    p = float(binomtest(only_a, only_a + only_b, 0.5).pvalue) if only_a + only_b else 1.0
    return {"only_a": only_a, "only_b": only_b, "both": both, "n": len(keys), "p": p}


def clustered_paired(a: dict, b: dict, dataset: str, cluster: dict) -> dict:
    """`paired` with questions grouped into clusters (`cluster`: key -> cluster label, e.g. the gold query
    several paraphrased questions share): the two-sided sign-flip test on each cluster's net change
    (right only in b minus right only in a), flipping whole clusters, exact up to 2^16 sign patterns
    (scipy.stats.permutation_test). Questions of one cluster are not independent, so this p is the
    honest one where McNemar's counts them as if they were. -> {clusters, moved: clusters with a
    non-zero net change, net, p}."""
    import numpy as np
    from scipy.stats import permutation_test
    net: dict = {}
    for k in a:
        if k[0] == dataset and k in b:
            net[cluster[k]] = net.get(cluster[k], 0) + int(b[k]) - int(a[k])
    d = np.array([v for v in net.values() if v], float)
    if len(d) < 2:  # one moved cluster: its two sign patterns have the same |sum|
        return {"clusters": len(net), "moved": len(d), "net": int(d.sum()), "p": 1.0}
    res = permutation_test((d,), np.sum, permutation_type="samples", alternative="two-sided",
                           n_resamples=np.inf if len(d) <= 16 else 100_000, random_state=0)
    return {"clusters": len(net), "moved": len(d), "net": int(d.sum()), "p": float(min(1.0, res.pvalue))}


def seed_question_bootstrap(a: list[dict], b: list[dict], dataset: str, n_boot: int = 10_000, seed: int = 0,
                            level: float = 0.95) -> dict:
    """Method A minus method B in accuracy on `dataset`, averaged over seeds, paired over questions: a[i] and
    b[i] are seed i's outcomes ({(dataset, question id): correct}, `_outcomes`) of the two methods, which share
    seed i's data order. The interval is a two-way bootstrap over seeds × questions: each resample draws S
    seed indices (A and B of a seed together) and Q questions (the same for every seed) with replacement,
    so it carries the training seeds' variance as well as the questions'. -> {diff, lo, hi, p_le0 (share of
    resamples with diff <= 0), p_ge0, seeds, questions}."""
    if len(a) != len(b) or not a:
        raise ValueError(f"seed_question_bootstrap: {len(a)} seeds of A, {len(b)} of B: pair them by seed")
    keys = sorted(set.intersection(*(set(k for k in x if k[0] == dataset) for x in a + b)))
    if not keys:
        raise ValueError(f"seed_question_bootstrap: no question of {dataset} answered by every run")
    d = np.array([[float(x[k]) - float(y[k]) for k in keys] for x, y in zip(a, b)])  # [S, Q]
    from dart_jax.analysis.intervals import two_way_resamples
    S, Q = d.shape
    boot = two_way_resamples(d, n_boot, seed)
    lo, hi = np.quantile(boot, [(1 - level) / 2, (1 + level) / 2])
    out = {"diff": float(d.mean()), "lo": float(lo), "hi": float(hi), "p_le0": float((boot <= 0).mean()),
           "p_ge0": float((boot >= 0).mean()), "seeds": S, "questions": Q, "n_boot": n_boot,
           "per_seed": d.mean(1).tolist()}
    if S > 1:  # few seeds: resampling them under-states their variance; a t interval on the seeds' differences
        from scipy import stats
        m = d.mean(1)
        half = stats.t.ppf((1 + level) / 2, S - 1) * m.std(ddof=1) / np.sqrt(S)
        out["seed_t"] = [float(m.mean() - half), float(m.mean() + half)]
    return out


def _eval_counts(eval_dir: str, datasets: list[str]) -> dict:
    """{dataset: (correct, questions)} from an evaluation's per-question outcomes."""
    outcomes = _outcomes(eval_dir, datasets)
    return {d: (sum(v for (ds, _), v in outcomes.items() if ds == d), sum(ds == d for ds, _ in outcomes))
            for d in datasets}


SKILLS = ("accuracy", "tool_skill", "chain_recall", "reasoning_skill", "chain_coverage", "copy_rate", "values_stated",
          "tool_calls")


def _skills(eval_dir: str, datasets: list[str]) -> dict:
    """{dataset: {skill: value}} of an evaluation's lab sets (results.json "lab" "pooled", lab.metrics.role_skills:
    tool skill = calls retrieving a new chain passage, reasoning skill = EM once the chain was retrieved, ...);
    {} for sets without role skills."""
    path = os.path.join(eval_dir, "results.json")
    if not os.path.isfile(path):
        return {}
    with open(path) as f:
        res = json.load(f)
    out = {}
    for d in datasets:
        pooled = ((res.get("datasets") or {}).get(d) or {}).get("lab", {}).get("pooled") or {}
        if pooled:
            out[d] = {k: float(pooled[f"lab/{k}"]) for k in SKILLS if f"lab/{k}" in pooled}
    return out


def skill_shifts(per_run: dict, reference: dict, datasets: list[str]) -> list[dict]:
    """Per (method, dataset, skill): the warm start's value, each seed's, their mean and range, and whether
    GRPO moved it beyond the seed spread (the warm start's value outside [min, max] of the seeds', with at
    least 2 seeds): what the lab asks of a quickstart budget."""
    out = []
    methods = list(dict.fromkeys(r["method"] for r in per_run.values()))
    for m in methods:
        rs = [r for r in per_run.values() if r["method"] == m]
        for d in datasets:
            for k in SKILLS:
                vals = [r["skills"][d][k] for r in rs if k in r.get("skills", {}).get(d, {})]
                ref = reference.get(d, {}).get(k)
                if not vals or ref is None:
                    continue
                lo, hi = min(vals), max(vals)
                out.append({"method": m, "dataset": d, "skill": k, "warm_start": ref, "per_seed": vals,
                            "mean": float(np.mean(vals)), "min": lo, "max": hi,
                            "beyond_seed_spread": len(vals) >= 2 and not lo <= ref <= hi})
    return out


def run_name_of(runs: dict, method: str, seed: int) -> str | None:
    return next((n for n, r in runs.items() if r["method"] == method and r["seed"] == seed), None)


def _median(rows: list[dict], key: str) -> float:
    vals = [r[key] for r in rows if key in r]
    return float(statistics.median(vals)) if vals else float("nan")


def signal(train_dir: str) -> dict | None:
    """GRPO's learning signal in a run: trajectories rewarded and groups (one prompt's samples at one
    step) with mixed scores — with two or more samples a group, the only groups whose advantages are
    not all zero — from the run's rollout records (rollouts.jsonl, or the archive's
    rollouts.jsonl.gz; rows left out of the update are not counted); None without them.
    mixed_per_step: one count for each step the records hold, in step order."""
    path = os.path.join(train_dir, "rollouts.jsonl")
    path = path if os.path.isfile(path) else path + ".gz"
    if not os.path.isfile(path):
        return None
    groups: dict[tuple, list[float]] = {}
    steps: set[int] = set()
    for r in read_records(path):
        steps.add(int(r["step"]))
        if r.get("in_update", True):
            groups.setdefault((r["step"], r["uid"]), []).append(float(r["score"]))
    return {"trajectories": sum(len(v) for v in groups.values()),
            "rewarded": sum(x > 0 for v in groups.values() for x in v), "groups": len(groups),
            "mixed": sum(len(set(v)) > 1 for v in groups.values()),
            "mixed_per_step": [sum(len(set(v)) > 1 for (s, _), v in groups.items() if s == step)
                               for step in sorted(steps)]}


def write_report(runs: dict, out: str, datasets: list[str], times: dict | None = None,
                 missing: list[str] | None = None, reference: str | None = None) -> dict:
    """runs: {name: {method, seed, train (run dir), eval (evaluation dir)}} -> summary (also written:
    report.md, summary.json, results.csv, reward_curves.png under `out`). `missing`: the comparison's
    runs not trained and evaluated yet, named in the report. `reference`: the evaluation directory of
    the starting policy (no GRPO), the row every run is paired against."""
    os.makedirs(out, exist_ok=True)
    per_run, curves = {}, {}
    for name, r in runs.items():
        rows = [x for x in read_metrics(os.path.join(r["train"], "metrics.jsonl")) if "reward/mean" in x]
        counts = _eval_counts(r["eval"], datasets)
        per_run[name] = {"method": r["method"], "seed": r["seed"], "counts": counts,
                         "em": {d: k / n if n else float("nan") for d, (k, n) in counts.items()},
                         "step_s": _median(rows, "time/step_s"), "update_s": _median(rows, "time/update_s"),
                         "rollout_s": _median(rows, "time/rollout_s"),
                         "train_state_mib": max((x.get("memory/train_state_mib", float("nan")) for x in rows),
                                                default=float("nan")),
                         "peak_rss_mib": max((x.get("memory/peak_rss_mib", float("nan")) for x in rows),
                                             default=float("nan")),
                         "steps": len(rows), "skills": _skills(r["eval"], datasets),
                         "signal": signal(r["train"])}
        per_run[name]["em"]["avg"] = float(np.mean([per_run[name]["em"][d] for d in datasets]))
        curves[name] = ([x["step"] for x in rows], [x["reward/mean"] for x in rows])
    methods = list(dict.fromkeys(r["method"] for r in per_run.values()))
    summary = {"datasets": datasets, "runs": per_run, "methods": {}, "missing": list(missing or [])}
    for m in methods:
        rs = [r for r in per_run.values() if r["method"] == m]
        entry = {"seeds": [r["seed"] for r in rs]}
        for d in datasets + ["avg"]:
            vals = [r["em"][d] for r in rs]
            entry[d] = {"mean": float(np.mean(vals)), "min": float(min(vals)), "max": float(max(vals)),
                        "per_seed": vals}
        for k in ("step_s", "update_s", "rollout_s", "train_state_mib", "peak_rss_mib"):
            entry[k] = float(np.nanmedian([r[k] for r in rs]))
        summary["methods"][m] = entry
    outcomes = {name: _outcomes(r["eval"], datasets) for name, r in runs.items()}
    pairs = []
    if reference:
        ref = _outcomes(reference, datasets)
        summary["reference"] = {"counts": _eval_counts(reference, datasets), "skills": _skills(reference, datasets)}
        summary["skill_shifts"] = skill_shifts(per_run, summary["reference"]["skills"], datasets)
        for name in runs:
            pairs += [dict(a=name, b="warm_start", dataset=d, **paired(outcomes[name], ref, d)) for d in datasets]
    for name, r in runs.items():
        dart = run_name_of(runs, "dart", r["seed"])
        if r["method"] != "dart" and dart:
            pairs += [dict(a=dart, b=name, dataset=d, **paired(outcomes[dart], outcomes[name], d)) for d in datasets]
    summary["paired"] = pairs
    summary["seed_question"] = []
    for m in methods:
        seeds = [r["seed"] for r in per_run.values() if r["method"] == m and run_name_of(runs, "dart", r["seed"])]
        if m == "dart" or not seeds:
            continue
        a = [outcomes[run_name_of(runs, "dart", s)] for s in seeds]
        b = [outcomes[run_name_of(runs, m, s)] for s in seeds]
        for d in datasets:
            try:
                summary["seed_question"].append(dict(a="dart", b=m, dataset=d, **seed_question_bootstrap(a, b, d)))
            except ValueError:  # no question of d answered by every run: nothing to pair
                pass
    with open(os.path.join(out, "summary.json"), "w") as f:
        json.dump(summary, f, indent=1)
    with open(os.path.join(out, "results.csv"), "w", newline="") as f:
        w = csv.writer(f)
        w.writerow(["method", "seed", "dataset", "correct", "questions", "em", "wilson_lo", "wilson_hi",
                    "step_s", "update_s", "train_state_mib", "peak_rss_mib"])
        for name, r in per_run.items():
            for d, (k, n) in r["counts"].items():
                lo, hi = wilson_interval(k, n) if n else (float("nan"), float("nan"))
                w.writerow([r["method"], r["seed"], d, k, n, f"{r['em'][d]:.4f}", f"{lo:.4f}", f"{hi:.4f}",
                            f"{r['step_s']:.1f}", f"{r['update_s']:.1f}", f"{r['train_state_mib']:.0f}",
                            f"{r['peak_rss_mib']:.0f}"])
    plot = _plot(curves, per_run, os.path.join(out, "reward_curves.png"))
    with open(os.path.join(out, "report.md"), "w") as f:
        f.write(_markdown(summary, per_run, datasets, times or {}))
    summary["files"] = {"report": os.path.join(out, "report.md"), "plot": plot}
    return summary


def _count_cell(r: dict, dataset: str) -> str:
    """A run's correct / questions = EM (Wilson 95%) on `dataset`."""
    k, n = r["counts"][dataset]
    lo, hi = wilson_interval(k, n) if n else (float("nan"), float("nan"))
    return f"{k}/{n} = {r['em'][dataset]:.3f} ({lo:.2f}–{hi:.2f})"


def _markdown(summary: dict, per_run: dict, datasets: list[str], times: dict) -> str:
    lines = ["# Method comparison", "",
             "Greedy EM on held-out questions: each seed's count (Wilson 95%), then the mean and the range over "
             "seeds. Step time = median seconds per GRPO step (rollout + update); memory = one device's train "
             "state (fp32 masters + AdamW moments) and the process's peak resident memory.", ""]
    rows = list(per_run.items())
    if summary.get("reference"):
        rows = [("warm start (no GRPO)", {"counts": summary["reference"]["counts"], "steps": 0,
                                          "em": {d: k / n if n else float("nan")
                                                 for d, (k, n) in summary["reference"]["counts"].items()}})] + rows
    lines.append(markdown_table(["run", *datasets, "steps"],
                                [[name, *(_count_cell(r, d) for d in datasets), r["steps"]] for name, r in rows]))
    methods = []
    for m, e in summary["methods"].items():
        paper = PAPER_QA.get((PAPER_KEY.get(m, m), "qwen2.5-3b-base"), {}).get("Avg")
        methods.append([f"{METHOD_NAMES.get(PAPER_KEY.get(m, m), m)} ({m})",
                        *(f"{e[d]['mean']:.3f} [{e[d]['min']:.3f}, {e[d]['max']:.3f}]" for d in datasets),
                        f"{e['avg']['mean']:.3f}", f"{e['step_s']:.0f}", f"{e['update_s']:.0f}",
                        f"{e['train_state_mib']:.0f}", f"{e['peak_rss_mib']:.0f}",
                        "%.3f" % paper if paper is not None else "—"])
    lines += ["", markdown_table(["method", *(f"{d} mean [range]" for d in datasets), "avg", "step (s)", "update (s)",
                                  "train state (MiB)", "peak RSS (MiB)", "paper 3B-Base Avg"], methods)]
    lines += ["", "The paper's column is Qwen2.5-3B-Base on wiki-18 with 100 steps of 256 × 16 trajectories "
              "(the paper's main QA table; full = Search-R1's row): orientation only.", "",
              "![reward curves](reward_curves.png)"]
    sig = [(name, r["signal"]) for name, r in per_run.items() if r.get("signal")]
    if sig:
        lines += ["", "## GRPO's signal", "",
                  "From each run's rollout records: trajectories with a positive score, and groups (one prompt's "
                  "samples at one step) whose scores differ — GRPO's advantages are zero in every other group of "
                  "two or more. Mixed per step: steps 1, 2, … in order.",
                  ""]
        lines.append(markdown_table(["run", "rewarded / trajectories", "mixed groups / groups", "mixed per step"], [
            [name, f"{g['rewarded']} / {g['trajectories']}", f"{g['mixed']} / {g['groups']} = "
             f"{g['mixed'] / g['groups']:.2f}" if g["groups"] else "0 / 0",
             " ".join(str(k) for k in g["mixed_per_step"])] for name, g in sig]))
    if summary.get("paired"):
        lines += ["", "## Paired on the same questions", "",
                  "Each row: questions right only in A / only in B / in both, of n; p = exact McNemar "
                  "(two-sided binomial on the discordant questions).", ""]
        by = {}
        for q in summary["paired"]:
            by.setdefault((q["a"], q["b"]), {})[q["dataset"]] = q
        lines.append(markdown_table(["A", "B", *datasets], [
            [a, b, *(f"{q['only_a']} / {q['only_b']} / {q['both']} of {q['n']}, p {q['p']:.2g}"
                     for q in (qs[d] for d in datasets))] for (a, b), qs in by.items()]))
    if summary.get("seed_question"):
        lines += ["", "## DART against each method, over seeds and questions", "",
                  "Accuracy of DART minus the method's, averaged over the seeds both ran, paired over questions; "
                  "95% interval from a bootstrap over seeds × questions (a seed's two runs, which share the data "
                  "order, resampled together; the same questions for every seed); p(≤ 0) = share of resamples "
                  "where DART is not ahead. With few seeds the resamples under-state the seeds' variance: the t "
                  "interval on the per-seed differences (S − 1 degrees of freedom) is the cautious reading.", ""]
        lines.append(markdown_table(["A", "B", "set", "A − B", "95% interval", "t interval (seeds)", "per seed",
                                     "p(≤ 0)", "p(≥ 0)", "seeds × questions"], [
            [q["a"], q["b"], q["dataset"], f"{q['diff']:+.3f}", f"[{q['lo']:+.3f}, {q['hi']:+.3f}]",
             "[{:+.3f}, {:+.3f}]".format(*q["seed_t"]) if "seed_t" in q else "—",
             ", ".join(f"{x:+.3f}" for x in q["per_seed"]),
             f"{q['p_le0']:.3f}", f"{q['p_ge0']:.3f}", f"{q['seeds']} × {q['questions']}"]
            for q in summary["seed_question"]]))
    if summary.get("skill_shifts"):
        lines += ["", "## Role skills (lab sets)", "",
                  "Pooled over each evaluation's trajectories (dart_jax/lab/metrics.py): tool skill = share of "
                  "calls that retrieve a gold-chain passage not retrieved before (not a copy of the question; it "
                  "rises as calls fall, the first lookup being the easiest); chain recall = share of the gold "
                  "chain's passages a trajectory retrieved; tool calls = calls per trajectory; "
                  "reasoning skill = EM among trajectories that retrieved the whole chain; chain coverage = "
                  "trajectories that did; values stated = gold intermediate values written in <think>. "
                  "\"beyond seed spread\": the warm start's value lies outside the seeds' range.", ""]
        lines.append(markdown_table(["method", "set", "skill", "warm start", "seeds", "mean [range]",
                                     "beyond seed spread"], [
            [q["method"], q["dataset"], q["skill"], f"{q['warm_start']:.3f}",
             ", ".join(f"{v:.3f}" for v in q["per_seed"]), f"{q['mean']:.3f} [{q['min']:.3f}, {q['max']:.3f}]",
             "yes" if q["beyond_seed_spread"] else "no"] for q in summary["skill_shifts"]]))
    if summary.get("missing"):
        lines += ["", f"**Partial comparison**: not yet trained and evaluated: {', '.join(summary['missing'])}."]
    if times:
        # each stage's items in the order they ran
        done = [[stage, item, f"{v['seconds'] / 60:.1f}", v.get("finished", "")] for stage, items in times.items()
                for item, v in sorted(items.items(), key=lambda kv: str(kv[1].get("finished", "")))]
        lines += ["", "## Wall time", ""]
        if any(v.get("logged") for v in times.get("train", {}).values()):
            lines += ["A training's minutes are its logged GRPO steps and held-out checks, summed over every "
                      "segment of a resumed run (a step a kill cut short is not kept); a step's time includes any "
                      "pause of its process (this host pauses long runs during benchmarks) and any other job "
                      "beside it. Other stages: the stage's own wall time.", ""]
        lines.append(markdown_table(["stage", "run", "minutes", "finished"], done))
    return "\n".join(lines) + "\n"


def _plot(curves: dict, per_run: dict, path: str) -> str:
    """Left: each step's mean training reward (thin: each seed; thick: the mean over seeds). Right: the
    running mean over steps 1..s of the same, which the prompts' step-to-step difficulty swings hide on
    the left (one seed gives every method the same prompts, so the methods are compared step for step)."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    fig, (ax, ax_cum) = plt.subplots(1, 2, figsize=(12, 4.2))
    methods = list(dict.fromkeys(r["method"] for r in per_run.values()))
    colours = plt.rcParams["axes.prop_cycle"].by_key()["color"]
    for i, m in enumerate(methods):
        names = [n for n, r in per_run.items() if r["method"] == m]
        c = colours[i % len(colours)]
        label = f"{METHOD_NAMES.get(PAPER_KEY.get(m, m), m)} (mean of {len(names)})"
        for n in names:
            ax.plot(*curves[n], color=c, alpha=0.3, lw=0.8)
        steps = sorted(set().union(*(set(curves[n][0]) for n in names)))
        mean = np.array([np.mean([dict(zip(*curves[n])).get(s, np.nan) for n in names]) for s in steps])
        ax.plot(steps, mean, color=c, lw=2, label=label)
        seen = np.cumsum(~np.isnan(mean))  # a step some seed lacks leaves a gap on the left, not the rest here
        with np.errstate(invalid="ignore", divide="ignore"):
            ax_cum.plot(steps, np.nancumsum(mean) / seen, color=c, lw=2, label=label)
    ax.set_ylabel("training reward (mean over the step's trajectories)")
    ax_cum.set_ylabel("running mean of the training reward")
    for a in (ax, ax_cum):
        a.set_xlabel("GRPO step")
        a.grid(alpha=0.3)
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return path
