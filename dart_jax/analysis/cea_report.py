"""CEA's solve stage: per-variant per-question accuracies in, β and its uncertainty out.

Writes to `out_dir`: `per_question.jsonl` (every question: k, n per variant, accuracies, β under
both estimators, kept or dropped), `beta.csv` (kept questions, the chosen estimator), `summary.json`
(per-coefficient statistics for both estimators and the two-level bootstrap of the share of
β23 < 0), `report.md`, and three PNGs (dart_jax.analysis.cea_plots).
"""

from __future__ import annotations

import csv
import json
import os
from typing import Mapping

import numpy as np

from dart_jax.analysis import cea
from dart_jax.analysis.tables import markdown_table

ACCURACY_FILE = "per_question_accuracy.jsonl"


def read_inputs(inputs: Mapping[str, str], variants: tuple[str, ...] = cea.VARIANTS) -> cea.Counts:
    """variant -> a `per_question_accuracy.jsonl` (or the evaluation directory holding one); `variants`:
    the six, or `cea.SINGLE` for β23 alone."""
    rows = {}
    for v, path in inputs.items():
        if v not in variants:
            raise ValueError(f"unknown CEA variant {v!r}; expected one of {variants}")
        f = os.path.join(path, ACCURACY_FILE) if os.path.isdir(path) else path
        if not os.path.isfile(f):
            raise FileNotFoundError(f"variant {v!r}: {f} not found (written by launch.evaluate --n-samples > 1)")
        with open(f) as fh:
            rows[v] = [json.loads(line) for line in fh if line.strip()]
        if not rows[v]:
            raise ValueError(f"variant {v!r}: {f} holds no questions")
    return cea.counts_from_rows(rows, variants)


def _fmt_ci(ci) -> str:
    return f"[{ci[0]:+.2f}, {ci[1]:+.2f}]"


STAT_COLUMNS = ("median (95% CI)", "share < 0 (95% CI)", "− / + / 0", "sign test p")


def _stat_cells(r: dict) -> list[str]:
    """One coefficient's summary (cea.summarize) as the cells after its name."""
    return [f"{r['mean']:+.2f} {_fmt_ci(r['mean_ci'])}", f"{r['median']:+.2f} {_fmt_ci(r['median_ci'])}",
            f"{r['share_negative']:.2f} [{r['share_negative_ci'][0]:.2f}, {r['share_negative_ci'][1]:.2f}]",
            f"{r['negative']} / {r['positive']} / {r['zero']}", f"{r['sign_test_p']:.3g}"]


def _table(s: dict) -> str:
    return markdown_table(["coefficient", "mean (95% CI)", *STAT_COLUMNS], [[c, *_stat_cells(s[c])] for c in cea.COEFS])


def solve_and_report(counts: cea.Counts, out_dir: str, estimator: str = "clip", n_boot: int = 10_000,
                     seed: int = 0, title: str = "CEA", figures: bool = True) -> dict:
    os.makedirs(out_dir, exist_ok=True)
    ests = {e: cea.estimate(counts, e) for e in cea.ESTIMATORS}
    est = ests[estimator]
    if not est.ids:
        raise ValueError(f"all {len(counts.ids)} questions were dropped: no variant answered any of them")
    summary = {"questions": len(counts.ids), "kept": len(est.ids), "dropped": est.dropped, "estimator": estimator,
               "samples_per_answer": sorted({int(x) for x in np.unique(counts.n)}),
               "variants": {v: float((counts.k[:, i] / counts.n[:, i]).mean()) for i, v in enumerate(cea.VARIANTS)}}
    for e, es in ests.items():
        summary[e] = cea.summarize(es.beta, n_boot=n_boot, seed=seed)
    if np.allclose(counts.k, np.round(counts.k)):
        summary["true_accuracy_b23"] = cea.sampling_bootstrap(counts, n_boot=n_boot, seed=seed)
    keep = cea.answered(counts.k)
    pos = {e: {q: i for i, q in enumerate(es.ids)} for e, es in ests.items()}
    with open(os.path.join(out_dir, "per_question.jsonl"), "w") as f:
        for qi, q in enumerate(counts.ids):
            rec = {"id": q, "kept": bool(keep[qi]),
                   "k": dict(zip(cea.VARIANTS, counts.k[qi].tolist())),
                   "n": dict(zip(cea.VARIANTS, counts.n[qi].tolist()))}
            for e, es in ests.items():
                if q in pos[e]:
                    rec[f"y_{e}"] = dict(zip(cea.VARIANTS, es.y[pos[e][q]].tolist()))
                    rec[f"beta_{e}"] = dict(zip(cea.COEFS, es.beta[pos[e][q]].tolist()))
            f.write(json.dumps(rec) + "\n")
    with open(os.path.join(out_dir, "beta.csv"), "w", newline="") as f:
        w = csv.writer(f)
        w.writerow(["id", *cea.COEFS, *(f"acc_{v}" for v in cea.VARIANTS)])
        raw = counts.k[keep] / counts.n[keep]
        for q, b, a in zip(est.ids, est.beta, raw):
            w.writerow([q, *(f"{x:.6g}" for x in b), *(f"{x:.6g}" for x in a)])
    files = {}
    if figures:
        from dart_jax.analysis.cea_plots import write_figures
        files = write_figures(est, counts.k[keep] / counts.n[keep], out_dir)
    summary["files"] = {k: os.path.basename(v) for k, v in files.items()}
    with open(os.path.join(out_dir, "summary.json"), "w") as f:
        json.dump(summary, f, indent=2)
    with open(os.path.join(out_dir, "report.md"), "w") as f:
        f.write(report_markdown(summary, title))
    return summary


def report_markdown(s: dict, title: str = "CEA") -> str:
    est = s["estimator"]
    other = [e for e in cea.ESTIMATORS if e != est][0]
    lines = [f"# {title}", "",
             f"{s['questions']} questions, {s['kept']} kept, {s['dropped']} dropped (no variant ever answered them); "
             f"samples per accuracy: {s['samples_per_answer']}. Mean accuracy per variant: "
             + ", ".join(f"{cea.LABELS[v]} {a:.3f}" for v, a in s["variants"].items()) + ".", "",
             f"## β per question ({est} estimator)", "", _table(s[est]), "",
             f"Intervals: {s[est]['_setup']['interval']}, {s[est]['_setup']['n_boot']} resamples, seed "
             f"{s[est]['_setup']['seed']}. Sign test: two-sided binomial on the non-zero signs.", ""]
    b23 = lambda e: s[e]["b23"]  # noqa: E731
    lines += ["## How the conclusion moves", "",
              markdown_table(["estimator", "β23 mean (95% CI)", "share β23 < 0 (95% CI over questions)"],
                             [[e, f"{b23(e)['mean']:+.2f} {_fmt_ci(b23(e)['mean_ci'])}",
                               f"{b23(e)['share_negative']:.2f} [{b23(e)['share_negative_ci'][0]:.2f}, "
                               f"{b23(e)['share_negative_ci'][1]:.2f}]"] for e in (est, other)])]
    t = s.get("true_accuracy_b23")
    if t:
        lines += ["", f"At the true accuracies (each accuracy drawn from its Jeffreys posterior given its answers, "
                  f"questions resampled; {t['n_boot']} draws): share β23 < 0 median {t['median']:.2f}, 95% interval "
                  f"[{t['ci'][0]:.2f}, {t['ci'][1]:.2f}]. This carries the noise of finite samples per accuracy; it "
                  "may sit away from the share of the point estimates, which are noisy. The variants are drawn "
                  "independently although answers sampled with the same seeds are correlated, so the interval is "
                  "conservative for contrasts."]
    else:
        lines += ["", "Fractional scores: no per-answer resampling."]
    lines.append("")
    for key, caption in (("beta23_histogram", "β23 histogram with the mean M_Unified accuracy per bin"),
                         ("interactions", "β12, β13, β23 side by side"),
                         ("beta23_vs_accuracy", "β23 against M_Unified accuracy")):
        if key in s.get("files", {}):
            lines += [f"![{caption}]({s['files'][key]})", ""]
    return "\n".join(lines)


def interference_and_report(inputs: Mapping[str, str], out_dir: str, n_boot: int = 10_000, seed: int = 0,
                            title: str = "CEA interference") -> dict:
    """β23 alone from the four single-model variants (`cea.SINGLE`: variant -> accuracy file or its
    directory), for a study whose compositions H_Tool / H_Reas were not sampled: β23 never reads them,
    so it is the full solve's β23 (up to the drop rule, which here sees four variants). Writes
    summary.json, beta.csv, per_question.jsonl, report.md and the two β23 figures to `out_dir`."""
    rows = {}
    for v in cea.SINGLE:
        if v not in inputs:
            raise ValueError(f"β23 needs the variants {cea.SINGLE}; missing {v!r}")
        f = os.path.join(inputs[v], ACCURACY_FILE) if os.path.isdir(inputs[v]) else inputs[v]
        with open(f) as fh:
            rows[v] = {f"{r['dataset']}/{r['id']}": r for r in map(json.loads, filter(str.strip, fh))}
    ids = sorted(rows["base"])
    for v in cea.SINGLE[1:]:
        if set(rows[v]) != set(ids):
            raise ValueError(f"variant {v!r} covers different questions than 'base': sample every variant on the "
                             "same questions")
    k = np.array([[float(rows[v][q]["correct"]) for v in cea.SINGLE] for q in ids], np.float64)
    n = np.array([[float(rows[v][q]["n"]) for v in cea.SINGLE] for q in ids], np.float64)
    os.makedirs(out_dir, exist_ok=True)
    summary = {"questions": len(ids),
               "variants": {v: float((k[:, i] / n[:, i]).mean()) for i, v in enumerate(cea.SINGLE)},
               "samples_per_answer": sorted({int(x) for x in np.unique(n)}), "coefficients": ["b23"],
               "note": "β23 from M_Base, M_Reas, M_Tool, M_Unified only (the compositions were not sampled)"}
    per_q = {q: {"id": q, "k": dict(zip(cea.SINGLE, k[i].tolist())), "n": dict(zip(cea.SINGLE, n[i].tolist()))}
             for i, q in enumerate(ids)}
    kept_b23 = {}
    for e in cea.ESTIMATORS:
        keep, b23 = cea.interference(k, n, e)
        kept_b23[e] = (keep, b23)
        if not keep.any():
            raise ValueError(f"all {len(ids)} questions were dropped: none of {cea.SINGLE} answered any of them")
        summary[e] = cea.summarize(b23[:, None], n_boot=n_boot, seed=seed, coefs=("b23",))
        for q, b in zip((q for q, kq in zip(ids, keep) if kq), b23):
            per_q[q][f"beta_{e}"] = {"b23": float(b)}
    keep, b23 = kept_b23["clip"]
    summary["kept"], summary["dropped"] = int(keep.sum()), int((~keep).sum())
    if np.allclose(k, np.round(k)):
        summary["true_accuracy_b23"] = cea.interference_bootstrap(k, n, n_boot=n_boot, seed=seed)
    for q, kq in zip(ids, keep):
        per_q[q]["kept"] = bool(kq)
    with open(os.path.join(out_dir, "per_question.jsonl"), "w") as f:
        f.writelines(json.dumps(r) + "\n" for r in per_q.values())
    raw_u = k[keep, 3] / n[keep, 3]
    with open(os.path.join(out_dir, "beta.csv"), "w", newline="") as f:
        w = csv.writer(f)
        w.writerow(["id", "b23_clip", "b23_jeffreys", *(f"acc_{v}" for v in cea.SINGLE)])
        for q, bc, bj, kk, nn in zip((q for q, kq in zip(ids, keep) if kq), b23, kept_b23["jeffreys"][1],
                                     k[keep], n[keep]):
            w.writerow([q, f"{bc:.6g}", f"{bj:.6g}", *(f"{x:.6g}" for x in kk / nn)])
    from dart_jax.analysis.cea_plots import beta23_histogram, beta23_vs_accuracy
    files = {"beta23_histogram": beta23_histogram(b23, "clip", raw_u, os.path.join(out_dir, "beta23_hist.png")),
             "beta23_vs_accuracy": beta23_vs_accuracy(b23, raw_u, os.path.join(out_dir, "beta23_vs_accuracy.png"))}
    summary["files"] = {key: os.path.basename(v) for key, v in files.items()}
    with open(os.path.join(out_dir, "summary.json"), "w") as f:
        json.dump(summary, f, indent=2)
    lines = [f"# {title}", "", f"{summary['questions']} questions, {summary['kept']} kept, {summary['dropped']} "
             f"dropped (none of the four single-model variants answered them). β23 only: H_Tool / H_Reas were not "
             "sampled (β23 = (z_U − z_T) − (z_R − z_B) does not read them). Mean accuracy: "
             + ", ".join(f"{cea.LABELS[v]} {a:.3f}" for v, a in summary["variants"].items()) + ".", "",
             markdown_table(["estimator", "β23 mean (95% CI)", *STAT_COLUMNS],
                            [[e, *_stat_cells(summary[e]["b23"])] for e in cea.ESTIMATORS])]
    t = summary.get("true_accuracy_b23")
    if t:
        lines += ["", f"At the true accuracies (Jeffreys posterior draws × question bootstrap, {t['n_boot']} draws): "
                  f"share β23 < 0 median {t['median']:.2f}, 95% interval [{t['ci'][0]:.2f}, {t['ci'][1]:.2f}]."]
    lines += ["", "![β23 histogram](beta23_hist.png)", "", "![β23 against M_Unified accuracy](beta23_vs_accuracy.png)",
              ""]
    with open(os.path.join(out_dir, "report.md"), "w") as f:
        f.write("\n".join(lines))
    return summary
