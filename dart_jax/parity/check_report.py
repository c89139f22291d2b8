"""What a cross-check reports: quantities with their fp32 / bf16 tolerances, and the report as
markdown and JSON (shared by the model, adapters, loss and step checks)."""

from __future__ import annotations

import contextlib
import dataclasses

import numpy as np

from dart_jax.analysis.tables import markdown_table

# (fp32, bf16) tolerances; "abs" = max |ours − torch|, "rel" = that over max |torch|. fp32 on CPU:
# SmolLM2's logits agree with transformers to ~1e-4 (GGUF weights, 49k vocabulary), so per-token
# log-probs to ~1e-4 and vocabulary sums (entropy, aggregates) to ~1e-4 relative.
TOLERANCES = {
    "advantages": ("abs", 1e-5, 1e-5),
    "logp": ("abs", 5e-4, 5e-1),
    "entropy": ("rel", 5e-4, 1e-1),  # lse − Σ p·z over the vocabulary: relative to max |H|
    "ratio": ("abs", 5e-4, 1.0),
    "loss": ("rel", 2e-4, 2.5e-1),
    "grad": ("norm", 1e-3, 3e-1),    # ‖g_ours − g_torch‖ / ‖g_torch‖ over every A and B
    "grad_max": ("rel", 2e-3, None),
    "params": ("rel", 5e-3, None),   # ‖θ_ours − θ_torch‖ / ‖θ_torch − θ_0‖ (see crosscheck_step); bf16:
    "params_lr": ("rel", 1e-2, None),  # the update inherits the gradient's bf16 error: reported, not held
    "logits": ("abs", 1e-3, 1.5e-1),   # `model` / `adapters`: logits and log-probs vs transformers
    "adapter_grad": ("abs", 1e-4, 5e-2),  # `adapters`: gradients of the token-mean NLL w.r.t. A, B
}


@contextlib.contextmanager
def tolerances(overrides: dict[str, float], dtype: str = "float32"):
    """Hold the checks to user tolerances (`launch.crosscheck --tol KEY=VALUE`): each key replaces the
    `dtype` column of TOLERANCES[key] while the block runs. Unknown keys are refused, never ignored."""
    unknown = sorted(set(overrides) - set(TOLERANCES))
    if unknown:
        raise ValueError(f"unknown tolerance {unknown}; expected some of {sorted(TOLERANCES)}")
    saved = dict(TOLERANCES)
    for key, value in overrides.items():
        kind, t32, t16 = TOLERANCES[key]
        TOLERANCES[key] = (kind, float(value), t16) if dtype == "float32" else (kind, t32, float(value))
    try:
        yield
    finally:
        TOLERANCES.clear()
        TOLERANCES.update(saved)

@dataclasses.dataclass
class Quantity:
    name: str
    kind: str
    diff: float
    scale: float
    tol_fp32: float | None  # None: reported, not held to a tolerance
    tol_bf16: float | None
    passed: bool

    @property
    def value(self) -> float:
        return self.diff / max(self.scale, 1e-30) if self.kind in ("rel", "norm") else self.diff


@dataclasses.dataclass
class CheckReport:
    check: str
    model: str
    dtype: str
    reference: str
    settings: dict
    differences: list
    quantities: list
    seconds: float

    @property
    def passed(self) -> bool:
        return all(q.passed for q in self.quantities)

    def to_dict(self) -> dict:
        d = dataclasses.asdict(self)
        d["pass"] = self.passed
        return d

    def markdown(self) -> str:
        """GitHub-flavoured markdown: a table with its separator row, a blank line before and after
        it, and every `|` inside a cell escaped (the measures are written with absolute values)."""
        lines = [f"# crosscheck {self.check}: {self.model} ({self.dtype}, reference {self.reference})", ""]
        if self.differences:
            lines += ["Conventions set for this reference (differences from dart_jax's defaults):", ""]
            lines += [f"- {' '.join(str(d).split())}" for d in self.differences] + [""]
        rows = []
        for q in self.quantities:
            measure = {"rel": "max |Δ| / max |torch|", "norm": "‖Δ‖ / ‖torch‖"}.get(q.kind, "max |Δ|")
            tols = ["—" if t is None else f"{t:.0e}" for t in (q.tol_fp32, q.tol_bf16)]
            rows.append(cells(q.name, measure, f"{q.value:.3e}", f"{q.scale:.3e}", tols[0], tols[1],
                              "PASS" if q.passed else "FAIL"))
        header = cells("quantity", "measure", "value", "max |torch|", "tol fp32", "tol bf16", "pass")
        lines.append(markdown_table(header, rows, align="---rrr-"))
        lines += ["", f"{'PASS' if self.passed else 'FAIL'} ({self.seconds:.1f} s)"]
        return "\n".join(lines) + "\n"


def cells(*values) -> list[str]:
    """Markdown table cells: a `|` in a cell is escaped, a line break becomes a space."""
    return [" ".join(str(c).split()).replace("|", "\\|") for c in values]


def within(value: float, tol: float | None) -> bool:
    """None: reported, not held to a tolerance."""
    return tol is None or bool(np.isfinite(value) and value <= tol)


def quantity(name: str, key: str, ours, theirs, dtype: str) -> Quantity:
    kind, t32, t16 = TOLERANCES[key]
    ours, theirs = np.asarray(ours, np.float64), np.asarray(theirs, np.float64)
    if kind == "norm":
        diff, scale = float(np.linalg.norm(ours - theirs)), float(np.linalg.norm(theirs))
    else:
        diff = float(np.max(np.abs(ours - theirs))) if ours.size else 0.0
        scale = float(np.max(np.abs(theirs))) if theirs.size else 0.0
    q = Quantity(name, kind, diff, scale, t32, t16, True)
    q.passed = within(q.value, t32 if dtype == "float32" else t16)
    return q


def metric(kind: str, a, b) -> tuple[float, float]:
    a, b = np.asarray(a, np.float64), np.asarray(b, np.float64)
    if kind == "norm":
        return float(np.linalg.norm(a - b)), float(np.linalg.norm(b))
    return float(np.max(np.abs(a - b))) if a.size else 0.0, float(np.max(np.abs(b))) if b.size else 0.0
