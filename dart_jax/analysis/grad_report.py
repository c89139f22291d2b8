"""Gradient alignment's report: the per-query statistics written by `experiments.grad_run` become
angles.csv, summary.json, report.md and the figures. Numbers here; drawing in grad_plots.

angles.csv: protocol, params, weighting, query, a, b, kind, tensor, layer, angle — one row per pair
and granularity: tensor "all" / layer "all" is the angle flattened over every parameter (the paper's),
tensor "all" / layer L over layer L's tensors, tensor T / layer "all" over T's layers, and (authors'
protocol) tensor T / layer L per unit (their per-parameter cosines). a, b: trajectory indices in the
query's group (paper), or "A" / "B" subsets (authors); kind: cross, same_reasoning, same_tool, or control
(the role-agnostic control's two random token sets of one trajectory). trajectories.csv (paper protocol): per
trajectory its score, accuracy, GRPO advantage and the tokens behind each of its gradients, to join on
(query, a) / (query, b).

Statistics. Pairs of one query are not independent, so comparisons are made across queries: each
query's median cross-role angle against its median same-role angle, a one-sided Wilcoxon signed-rank
test (cross > same) over queries and a bootstrap CI (seeded, 10k) of the median paired difference.
The authors' protocol keeps their own statistic beside it: per layer, one-sided Wilcoxon over (sample,
unit) pairs when n ≥ 10, after dropping samples whose every angle is ≤ 1°.
"""

from __future__ import annotations

import csv
import json
import os

import numpy as np

from dart_jax.analysis import grad_angles as ga
from dart_jax.analysis.grad_angles import GRAD_PROTOCOLS, defined_angle, describe as _describe, flip, paper_pairs
from dart_jax.analysis.grad_routed import authors_routed, routed_shares
from dart_jax.analysis.tables import markdown_table

KINDS = ("cross", "same_reasoning", "same_tool")
CONTROL = "control"  # two random token sets of one trajectory, of the roles' sizes (when the study ran it)


def _load(d: str) -> list[dict]:
    if not os.path.isdir(d):
        return []
    out = []
    for f in sorted(os.listdir(d)):
        if f.endswith(".npz") and not f.endswith(".tmp.npz"):
            with np.load(os.path.join(d, f), allow_pickle=False) as z:
                out.append({k: z[k] for k in z.files})
    return out


def paired_test(cross: np.ndarray, same: np.ndarray, n_boot: int = 10_000, seed: int = 0) -> dict:
    """Per-query medians, paired: Wilcoxon one-sided (cross > same) and the bootstrap CI of the median
    difference over queries."""
    from scipy.stats import wilcoxon
    c, s = np.asarray(cross, np.float64), np.asarray(same, np.float64)
    ok = np.isfinite(c) & np.isfinite(s)
    d = c[ok] - s[ok]
    out = {"queries": int(len(d))}
    if not len(d):
        return out
    out["median_difference"] = float(np.median(d))
    out["share_cross_above"] = float(np.mean(d > 0))
    rng = np.random.default_rng(seed)
    boots = np.median(d[rng.integers(0, len(d), (n_boot, len(d)))], axis=1)
    out["ci95"] = [float(np.percentile(boots, 2.5)), float(np.percentile(boots, 97.5))]
    out["wilcoxon_p"] = float(wilcoxon(d, alternative="greater").pvalue) if len(d) >= 2 and np.any(d != 0) \
        else float("nan")
    return out


# -- paper protocol --------------------------------------------------------------------------------
def identical_pairs(gram: np.ndarray, ij: list[tuple[int, int]], rtol: float = 1e-6) -> np.ndarray:
    """bool per pair: the two gradients are the same vector (equal squared norms and g1·g2 = |g1|²,
    to rtol) — two trajectories whose tokens agree up to the role's last token (a peaked policy
    repeats itself). Exact and sketched Gram matrices both show it (a sketch is deterministic)."""
    tot = gram.sum(0)
    i, j = np.asarray(ij).T
    ni, nj, d = tot[i, i], tot[j, j], tot[i, j]
    scale = np.maximum(np.maximum(ni, nj), 1e-300)
    return (np.abs(ni - nj) <= rtol * scale) & (np.abs(d - ni) <= rtol * scale) & (ni > 0)


def paper_tables(records: list[dict], weighting: str):
    """-> (rows for angles.csv, flattened angles per kind, per-query medians per kind, per-layer angles
    per kind {layer: [angles]}, the share of same-role pairs with identical gradients). Kinds: KINDS
    and, for the same-role kinds, `<kind>_distinct` (identical gradients left out)."""
    kinds = KINDS + (CONTROL,) + tuple(f"{k}_distinct" for k in KINDS[1:])
    rows, flat = [], {k: [] for k in kinds}
    med = {k: [] for k in kinds}
    per_layer: dict = {k: {} for k in kinds}
    identical = {k: [] for k in KINDS[1:]}
    for r in records:
        uid, gram, names, layers = str(r["uid"]), r["gram"], r["names"], r["layers"]
        g = len(r["advantages"])
        pairs = paper_pairs(r["present"], r["advantages"], weighting)
        tensors = list(dict.fromkeys(names.tolist()))
        layer_ids = sorted(set(layers.tolist()))
        for kind in KINDS + (CONTROL,):
            ps = pairs[kind]
            same_role = kind.startswith("same")
            if not ps:
                med[kind].append(np.nan)
                if same_role:
                    med[f"{kind}_distinct"].append(np.nan)
                continue
            ij = [(i, j) for i, j, _ in ps]
            flips = [f for _, _, f in ps]
            same = identical_pairs(gram, ij) if same_role else np.zeros(len(ps), bool)
            theta = flip(ga_pairs(gram, ij), flips)
            views = [(kind, np.ones(len(ps), bool))]
            if same_role:
                identical[kind] += same.tolist()
                views.append((f"{kind}_distinct", ~same))
            by_layer = {layer: flip(ga_pairs(gram, ij, layers == layer), flips) for layer in layer_ids}
            for name, keep in views:
                flat[name] += theta[keep].tolist()
                med[name].append(float(np.median(theta[keep])) if keep.any() else np.nan)
                for layer, th in by_layer.items():
                    per_layer[name].setdefault(layer, []).extend(th[keep].tolist())
            for (i, j, _), t, dup in zip(ps, theta, same):
                rows.append(("paper", weighting, uid, i % g, j % g, kind, "all", "all", t, int(dup)))
            for layer, th in by_layer.items():
                rows += [("paper", weighting, uid, i % g, j % g, kind, "all", layer, t, int(dup))
                         for (i, j, _), t, dup in zip(ps, th, same)]
            for name in tensors:
                th = flip(ga_pairs(gram, ij, names == name), flips)
                rows += [("paper", weighting, uid, i % g, j % g, kind, name, "all", t, int(dup))
                         for (i, j, _), t, dup in zip(ps, th, same)]
    shares = {k: float(np.mean(v)) if v else float("nan") for k, v in identical.items()}
    return rows, flat, med, per_layer, shares


def trajectory_rows(records: list[dict]) -> list[list]:
    """Per trajectory of the paper protocol's queries: query, index in its group, score, accuracy, GRPO advantage,
    and the tokens behind each of its gradients (reasoning, tool, and the control's two sets, empty without the
    control) — what angles.csv's pairs are made of (trajectories.csv)."""
    out = []
    for r in records:
        g, tok = len(r["advantages"]), np.asarray(r["tokens"])
        for i in range(g):
            ctrl = [int(tok[2 * g + i]), int(tok[3 * g + i])] if len(tok) == 4 * g else ["", ""]
            out.append([str(r["uid"]), i, float(r["scores"][i]), float(r["accuracy"][i]), float(r["advantages"][i]),
                        int(tok[i]), int(tok[g + i]), *ctrl])
    return out


def ga_pairs(gram: np.ndarray, ij: list[tuple[int, int]], units: np.ndarray | None = None) -> np.ndarray:
    g = gram if units is None else gram[units]
    tot = g.sum(0)
    i, j = np.asarray(ij).T
    return defined_angle(tot[i, j], tot[i, i], tot[j, j])


# -- authors' protocol -----------------------------------------------------------------------------
def authors_tables(records: list[dict], weighting: str):
    """-> (rows, per-unit angle matrices {cross, same} [S, U] after dropping flat samples, layers [U],
    flattened angle per sample per kind, counts)."""
    rows, flat = [], {"cross": [], "same": []}
    mats = {"cross": [], "same": []}
    layers = names = None
    for r in records:
        uid = str(r["uid"])
        names, layers = r["names"], r["layers"]
        for kind in ("cross", "same"):
            dot, n1, n2 = (r[f"{weighting}_{kind}_{x}"] for x in ("dot", "n1", "n2"))
            mats[kind].append(defined_angle(dot, n1, n2))
            flat[kind].append(float(defined_angle(np.nansum(dot), np.nansum(n1), np.nansum(n2))
                                    if np.isfinite(dot).all() else np.nan))
    if not records:
        return rows, {}, None, flat, {"samples": 0, "kept": 0}
    cross, same = np.stack(mats["cross"]), np.stack(mats["same"])
    keep = ga.drop_flat_samples(cross) & ga.drop_flat_samples(same)
    for q, (r, c_row, s_row) in enumerate(zip(records, cross, same)):
        uid = str(r["uid"])
        for kind, a, b, row in (("cross", "A:tool", "A:answer", c_row), ("same", "A:tool", "B:tool", s_row)):
            rows.append(("authors", weighting, uid, a, b, kind, "all", "all", flat[kind][q], 0))
            rows += [("authors", weighting, uid, a, b, kind, n, int(ly), float(t), 0)
                     for n, ly, t in zip(names.tolist(), layers.tolist(), row)]
    return rows, {"cross": cross[keep], "same": same[keep]}, layers, flat, {"samples": len(records),
                                                                               "kept": int(keep.sum())}


def write_report(study_dir: str, out: str, c, times: dict | None = None, n_boot: int = 10_000,
                 cells: list[tuple[str, str]] | None = None) -> dict:
    """`study_dir`/grads/<params>/<protocol> for each (params, protocol) of `cells` (default: the config's
    params × protocols; those without gradients are left out) -> `out`/{angles.csv, summary.json, report.md,
    *.png}. The setting's params / protocols become the ones reported."""
    from dart_jax.analysis import grad_plots
    os.makedirs(out, exist_ok=True)
    summary: dict = {"setting": {k: (list(v) if isinstance(v, (list, tuple)) else v) for k, v in c.items()},
                     "paper": {}, "authors": {}, "stage_seconds": times or {}}
    csv_path = os.path.join(out, "angles.csv")
    paper_figs, layer_figs = {}, {}
    with open(csv_path, "w", newline="") as f:
        w = csv.writer(f)
        w.writerow(["protocol", "params", "weighting", "query", "a", "b", "kind", "tensor", "layer", "angle",
                    "identical"])
        reported, trajectories = [], []
        for params, protocol in (cells if cells is not None else
                                 [(p, q) for p in c.params for q in c.protocols]):
            records = _load(os.path.join(study_dir, "grads", params, protocol))
            if not records:
                continue
            reported.append((params, protocol))
            secs = [float(r["seconds"]) for r in records if "seconds" in r]
            if protocol == "paper" and (shares := routed_shares(records)) is not None:
                summary.setdefault("routed_shares", {})[params] = shares
            if protocol == "paper":
                trajectories += [[params, *row] for row in trajectory_rows(records)]
            summary.setdefault("query_seconds", {})[f"{params}/{protocol}"] = {
                "queries": len(records), "timed": len(secs), "total": round(sum(secs), 1)}
            for weighting in ("advantage", "loglik"):
                key = f"{params}/{weighting}"
                if protocol == "paper":
                    rows, flat, med, per_layer, shares = paper_tables(records, weighting)
                    s = {k: _describe(v) for k, v in flat.items()}
                    s["identical_share"] = shares
                    s["queries"] = len(records)
                    s["exact"] = bool(all(bool(r["exact"]) for r in records))
                    s["sketch_dim"] = int(max(int(r["sketch_dim"]) for r in records))
                    for kind in ("same_reasoning", "same_tool", "same_reasoning_distinct", "same_tool_distinct"):
                        s[f"cross_vs_{kind}"] = paired_test(med["cross"], med[kind], n_boot)
                    shown = ("cross", "same_reasoning_distinct", "same_tool_distinct")
                    if flat[CONTROL]:
                        s[f"cross_vs_{CONTROL}"] = paired_test(med["cross"], med[CONTROL], n_boot)
                        shown += (CONTROL,)
                    else:  # the study did not run the control: nothing about it is reported
                        del s[CONTROL]
                    s["per_layer"] = {k: {int(ly): _describe(v) for ly, v in per_layer[k].items()}
                                      for k in per_layer if k != CONTROL or per_layer[k]}
                    summary["paper"][key] = s
                    paper_figs[key] = {k: flat[k] for k in shown}
                    layer_figs[("paper", key)] = ({k: per_layer[k] for k in shown}, None)
                else:
                    rows, m, layers, flat, counts = authors_tables(records, weighting)
                    s = {"flattened": {k: _describe(v) for k, v in flat.items()}, **counts,
                         "cross_vs_same": paired_test(flat["cross"], flat["same"], n_boot)}
                    if m:
                        s["per_layer"] = {"cross": ga.layer_summary(m["cross"], layers),
                                          "same": ga.layer_summary(m["same"], layers),
                                          "tests": ga.layer_tests(m["cross"], m["same"], layers,
                                                                  int(c.get("min_n", 10)))}
                        layer_figs[("authors", key)] = (
                            {"cross": {int(ly): m["cross"][:, layers == ly].ravel().tolist()
                                       for ly in sorted(set(layers.tolist()))},
                             "same": {int(ly): m["same"][:, layers == ly].ravel().tolist()
                                      for ly in sorted(set(layers.tolist()))}},
                            s["per_layer"]["tests"])
                    if (routed := authors_routed(records, weighting)) is not None:
                        s["routed"] = routed
                    summary["authors"][key] = s
                for row in rows:
                    w.writerow([row[0], params, *row[1:]])
    if reported:
        summary["setting"]["params"] = list(dict.fromkeys(p for p, _ in reported))
        summary["setting"]["protocols"] = [q for q in GRAD_PROTOCOLS if any(q == r for _, r in reported)]
    files = {"angles": csv_path}
    if trajectories:
        files["trajectories"] = os.path.join(out, "trajectories.csv")
        with open(files["trajectories"], "w", newline="") as f:
            w = csv.writer(f)
            w.writerow(["params", "query", "trajectory", "score", "accuracy", "advantage", "reasoning_tokens",
                        "tool_tokens", "control_a_tokens", "control_b_tokens"])
            w.writerows(trajectories)
    if paper_figs:
        files["histogram"] = grad_plots.cross_vs_same(paper_figs, os.path.join(out, "paper_cross_vs_same.png"))
    for (protocol, key), (per_layer, tests) in layer_figs.items():
        name = f"{protocol}_layers_{key.replace('/', '_')}.png"
        labels = {"cross": "tool(A) vs answer(A)", "same": "tool(A) vs tool(B)"} if protocol == "authors" else None
        files[f"layers {protocol} {key}"] = grad_plots.per_layer(per_layer, tests, os.path.join(out, name),
                                                                 f"{protocol} protocol, {key}", labels)
    summary["files"] = files
    with open(os.path.join(out, "summary.json"), "w") as f:
        json.dump(summary, f, indent=1, default=float)
    with open(os.path.join(out, "report.md"), "w") as f:
        f.write(render(summary))
    return summary


def _fmt(d: dict) -> str:
    if not d.get("n"):
        return "—"
    return f"{d['median']:.1f}° [{d['q1']:.1f}, {d['q3']:.1f}] (n {d['n']})"


def render(summary: dict) -> str:
    lines = ["# Gradient alignment: reasoning vs tool", ""]
    st = summary["setting"]
    lines += [f"Setting: {st.get('datasets')} (first {st.get('limit')}), G = {st.get('group_size')} at "
              f"T = {st.get('temperature')}, up to {st.get('queries')} queries with mixed outcomes; "
              f"params {st.get('params')}; protocols {st.get('protocols')}.", ""]
    if summary["paper"]:
        lines += ["## Paper protocol (per trajectory, flattened over all parameters)", "",
                  "Median angle [IQR] (pairs). Cross = reasoning vs tool gradient of one trajectory; same = one "
                  "role, two trajectories of a query: all pairs, and *distinct* pairs (pairs whose two gradients "
                  "are the same vector — the trajectories agree token for token up to the role's last token — "
                  "left out; their share is given). Test: each query's median cross angle vs its median "
                  "distinct same-role angle (Wilcoxon one-sided, cross > same; bootstrap 95% CI of the median "
                  "difference over queries).", ""]
        rows = []
        for key, s in summary["paper"].items():
            tests = []
            for kind in ("same_reasoning_distinct", "same_tool_distinct"):
                t = s[f"cross_vs_{kind}"]
                tests.append(f"{t['median_difference']:+.1f}° [{t['ci95'][0]:+.1f}, {t['ci95'][1]:+.1f}], "
                             f"p {t['wilcoxon_p']:.2g} ({t['queries']} q)" if t.get("queries") else "—")
            near = s["cross"].get("share_80_100")
            how = "" if s["exact"] else f" (sketch {s['sketch_dim']})"
            same = []
            for kind in ("same_reasoning", "same_tool"):
                share = s["identical_share"].get(kind, float("nan"))
                same.append(f"{_fmt(s[kind])} / {_fmt(s[kind + '_distinct'])} ({share:.0%})")
            rows.append([f"{key}{how}", s["queries"], _fmt(s["cross"]), "—" if near is None else f"{near:.0%}",
                         same[0], same[1], tests[0], tests[1]])
        lines += [markdown_table(["params / weighting", "queries", "cross", "cross in 80–100°",
                                  "same reasoning: all / distinct (identical share)",
                                  "same tool: all / distinct (identical share)", "cross − same reas. (CI, p)",
                                  "cross − same tool (CI, p)"], rows), ""]
        controlled = {k: s for k, s in summary["paper"].items() if CONTROL in s}
        if controlled:
            lines += ["Role-agnostic control: each trajectory's reasoning and tool tokens together, split at random "
                      "into two sets of the two roles' sizes; the angle between the two sets' gradients is what any "
                      "two token sets of one trajectory give. Test: each query's median cross-role angle vs its "
                      "median control angle (Wilcoxon one-sided, cross > control; bootstrap 95% CI).", ""]
            rows = []
            for key, s in controlled.items():
                t = s[f"cross_vs_{CONTROL}"]
                rows.append([key, _fmt(s["cross"]), _fmt(s[CONTROL]),
                             f"{t['median_difference']:+.1f}° [{t['ci95'][0]:+.1f}, {t['ci95'][1]:+.1f}], "
                             f"p {t['wilcoxon_p']:.2g} ({t['queries']} q)" if t.get("queries") else "—"])
            lines += [markdown_table(["params / weighting", "cross (one trajectory)", "control (one trajectory)",
                                      "cross − control (CI, p)"], rows), ""]
    def share(d):
        return f"{d['median']:.3f} [{d['q1']:.3f}, {d['q3']:.3f}] ({d['min']:.3f}, n {d['n']})" if d.get("n") else "—"
    for params, sh in (summary.get("routed_shares") or {}).items():
        lines += [f"Routed adapters ({params}): share of a role's squared gradient norm on its own adapter, per "
                  "trajectory, median [IQR] (min): reasoning tokens on the reasoning adapter "
                  f"{share(sh['reasoning'])}; "
                  f"tool tokens on the tool adapter {share(sh['tool'])}. Both shares near "
                  "1 would make the cross-role angle ≈ 90° by construction (disjoint parameters). Cross-role angle "
                  "on one adapter's units only: reasoning adapter "
                  f"{_fmt(sh['cross_on']['reasoning'])}, tool adapter {_fmt(sh['cross_on']['tool'])}.", ""]
    if summary["authors"]:
        lines += ["## Authors' protocol (5-response batches, per parameter tensor)", "",
                  "Cross = tool-span gradient vs answer-span gradient of subset A; same = tool-span gradients of "
                  "subsets A and B. Flattened angles per sample, and the layers where the per-layer Wilcoxon "
                  "(cross > same, n ≥ 10 pairs) gives p < 0.05.", ""]
        rows = []
        for key, s in summary["authors"].items():
            t = s["cross_vs_same"]
            sig = [ly for ly, v in s.get("per_layer", {}).get("tests", {}).items()
                   if v["p"] == v["p"] and v["p"] < 0.05]
            n_l = len(s.get("per_layer", {}).get("tests", {}))
            test = (f"{t['median_difference']:+.1f}° [{t['ci95'][0]:+.1f}, {t['ci95'][1]:+.1f}], "
                    f"p {t['wilcoxon_p']:.2g}"
                    if t.get("queries") else "—")
            rows.append([key, f"{s['kept']}/{s['samples']}", _fmt(s["flattened"]["cross"]),
                         _fmt(s["flattened"]["same"]), test, f"{len(sig)}/{n_l}"])
        lines += [markdown_table(["params / weighting", "samples kept", "cross (flattened)", "same (flattened)",
                                  "cross − same (CI, p)", "layers p < 0.05"], rows), ""]
        for key, s in summary["authors"].items():
            if "routed" in s:
                lines += [f"Routed adapters ({key}), one adapter's units only: " + "; ".join(
                    f"{role} adapter: flattened cross {_fmt(v['flattened']['cross'])}, same "
                    f"{_fmt(v['flattened']['same'])}; per tensor (kept samples) cross "
                    f"{_fmt(v['per_tensor']['cross'])}, "
                    f"same {_fmt(v['per_tensor']['same'])}" for role, v in s["routed"].items()) + ".", ""]
    times = summary.get("stage_seconds") or {}
    qs = summary.get("query_seconds") or {}
    if times or qs:
        lines += ["## Wall time", ""]
        for key, v in qs.items():
            if v["timed"]:
                lines.append(f"- grads {key}: {v['total'] / 60:.1f} min over {v['timed']} of {v['queries']} queries "
                             f"({v['total'] / v['timed']:.0f} s a query)")
        for stage, items in times.items():
            for item, v in items.items():
                # a reported cell's queries carry its time over every sitting; cells not reported are left out
                if stage != "grads" or (item in qs and not qs[item]["timed"]):
                    lines.append(f"- {stage} {item}: {v['seconds']:.0f} s")
        lines.append("")
    lines += ["Files: " + ", ".join(os.path.basename(p) for p in summary.get("files", {}).values()), ""]
    return "\n".join(lines)
