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

ACCURACY_FILE = "per_question_accuracy.jsonl"


def read_inputs(inputs: Mapping[str, str]) -> cea.Counts:
    """variant -> a `per_question_accuracy.jsonl` (or the evaluation directory holding one)."""
    rows = {}
    for v, path in inputs.items():
        if v not in cea.VARIANTS:
            raise ValueError(f"unknown CEA variant {v!r}; expected one of {cea.VARIANTS}")
        f = os.path.join(path, ACCURACY_FILE) if os.path.isdir(path) else path
        if not os.path.isfile(f):
            raise FileNotFoundError(f"variant {v!r}: {f} not found (written by launch.evaluate --n-samples > 1)")
        with open(f) as fh:
            rows[v] = [json.loads(line) for line in fh if line.strip()]
        if not rows[v]:
            raise ValueError(f"variant {v!r}: {f} holds no questions")
    return cea.counts_from_rows(rows)


def _fmt_ci(ci) -> str:
    return f"[{ci[0]:+.2f}, {ci[1]:+.2f}]"


def _table(s: dict) -> list[str]:
    lines = ["| coefficient | mean (95% CI) | median (95% CI) | share < 0 (95% CI) | − / + / 0 | sign test p |",
             "|---|---|---|---|---|---|"]
    for c in cea.COEFS:
        r = s[c]
        lines.append(f"| {c} | {r['mean']:+.2f} {_fmt_ci(r['mean_ci'])} | {r['median']:+.2f} {_fmt_ci(r['median_ci'])} "
                     f"| {r['share_negative']:.2f} [{r['share_negative_ci'][0]:.2f}, {r['share_negative_ci'][1]:.2f}] "
                     f"| {r['negative']} / {r['positive']} / {r['zero']} | {r['sign_test_p']:.3g} |")
    return lines


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
                   "k": dict(zip(cea.VARIANTS, counts.k[qi].tolist())), "n": dict(zip(cea.VARIANTS, counts.n[qi].tolist()))}
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
             f"## β per question ({est} estimator)", "", *_table(s[est]), "",
             f"Intervals: {s[est]['_setup']['interval']}, {s[est]['_setup']['n_boot']} resamples, seed "
             f"{s[est]['_setup']['seed']}. Sign test: two-sided binomial on the non-zero signs.", ""]
    b23 = lambda e: s[e]["b23"]  # noqa: E731
    lines += ["## How the conclusion moves", "",
              "| estimator | β23 mean (95% CI) | share β23 < 0 (95% CI over questions) |", "|---|---|---|"]
    for e in (est, other):
        lines.append(f"| {e} | {b23(e)['mean']:+.2f} {_fmt_ci(b23(e)['mean_ci'])} | {b23(e)['share_negative']:.2f} "
                     f"[{b23(e)['share_negative_ci'][0]:.2f}, {b23(e)['share_negative_ci'][1]:.2f}] |")
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
