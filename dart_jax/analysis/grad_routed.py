"""Gradient alignment on a DART policy's two routed adapters: where each role's gradient lies (the share of its
squared norm on its own adapter) and the angles restricted to one adapter's units, for the paper protocol's Gram
matrices and the authors' per-unit statistics. Numbers only; grad_report puts them in the report."""

from __future__ import annotations

import numpy as np

from dart_jax.analysis import grad_angles as ga
from dart_jax.analysis.grad_angles import defined_angle, describe as _describe

ROUTED = ("reasoning", "tool")  # the two adapters of a DART policy, first key of a unit's name


def routed_units(names) -> dict | None:
    """{role: mask over units} when every unit belongs to one of DART's two adapters (its name starts with
    "['reasoning']" or "['tool']") and both occur; else None (a shared LoRA, or full parameters)."""
    names = np.asarray([str(n) for n in names])
    own = {role: np.char.startswith(names, f"['{role}']") for role in ROUTED}
    if not (own["reasoning"].any() and own["tool"].any()) or (own["reasoning"] | own["tool"]).sum() != len(names):
        return None
    return own


def routed_shares(records: list[dict]) -> dict | None:
    """Where each role's gradient lies when the parameters are a DART policy's two routed adapters: per
    trajectory, the share of the reasoning-token gradient's squared norm on the reasoning adapter and of the
    tool-token gradient's on the tool adapter (Gram diagonals summed by adapter; the weighting only scales a
    gradient, so the shares are the same under both). Hard routing sends a role's tokens through its own
    adapter only, but the loss reaches the other adapter through attention to positions routed there, so a
    cross-role angle near 90° is not by construction unless both shares are near 1. Also the cross-role
    angle restricted to each adapter (reasoning vs tool gradient of one trajectory, on that adapter's units
    only). None when the units are not DART's two adapters (the shared LoRA, or full parameters)."""
    shares = {role: [] for role in ROUTED}
    cross_on = {role: [] for role in ROUTED}
    for r in records:
        own = routed_units(r["names"])
        if own is None:
            return None
        gram = np.asarray(r["gram"], np.float64)
        sq = np.einsum("tii->ti", gram)  # (units, 2G) squared norms
        # columns: reasoning gradients of the G trajectories, then their tool gradients (then, with the control,
        # the two random token sets: not a role, left out here)
        g = len(r["advantages"]) if "advantages" in r else sq.shape[1] // 2
        for k, role in enumerate(ROUTED):
            for i in range(g):
                col = k * g + i
                total = sq[:, col].sum()
                if r["present"][col] and total > 0:
                    shares[role].append(float(sq[own[role], col].sum() / total))
        for role in ROUTED:
            u = own[role]
            for i in range(g):
                if r["present"][i] and r["present"][g + i]:
                    cross_on[role].append(float(defined_angle(gram[u, i, g + i].sum(), sq[u, i].sum(),
                                                              sq[u, g + i].sum())))
    return {**{role: _describe(v) for role, v in shares.items()},
            "cross_on": {role: _describe(v) for role, v in cross_on.items()}}


def authors_routed(records: list[dict], weighting: str) -> dict | None:
    """The authors' statistics on each of a DART policy's two routed adapters: per sample, the cross
    (tool(A) vs answer(A)) and same (tool(A) vs tool(B)) angles flattened over one adapter's units only
    (all samples, as the flattened column), and the per-tensor angles on that adapter over the kept
    samples (as the per-layer statistics). None when the units are not DART's two adapters."""
    if not records:
        return None
    own = routed_units(records[0]["names"])
    if own is None:
        return None
    if any(not np.array_equal(np.asarray(r["names"]), np.asarray(records[0]["names"])) for r in records[1:]):
        raise ValueError("authors_routed: the records' units differ (gradients of different parameter trees)")
    mats = {"cross": [], "same": []}
    flat = {role: {"cross": [], "same": []} for role in ROUTED}
    for r in records:
        for kind in ("cross", "same"):
            dot, n1, n2 = (np.asarray(r[f"{weighting}_{kind}_{x}"], np.float64) for x in ("dot", "n1", "n2"))
            mats[kind].append(defined_angle(dot, n1, n2))
            for role in ROUTED:
                u = own[role]
                flat[role][kind].append(float(defined_angle(dot[u].sum(), n1[u].sum(), n2[u].sum())))
    cross, same = np.stack(mats["cross"]), np.stack(mats["same"])
    keep = ga.drop_flat_samples(cross) & ga.drop_flat_samples(same)
    out = {}
    for role in ROUTED:
        u = own[role]
        out[role] = {"flattened": {k: _describe(v) for k, v in flat[role].items()},
                     "per_tensor": {"cross": _describe(cross[keep][:, u].ravel()),
                                    "same": _describe(same[keep][:, u].ravel())}}
    return out
