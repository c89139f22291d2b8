"""Gradient alignment (the paper's interference analysis): the numbers — angles between gradient trees, their
aggregation per tensor and per layer, a seeded sketch for many-gradient comparisons, and the DART
authors' per-layer statistics. No model code and no plotting here.

A gradient is a pytree of arrays (a base tree, an adapter tree, or both). Angles are built from
per-unit inner products accumulated leaf by leaf, so no flattened copy of a gradient is ever made:
a unit is one (tensor, layer) — layer-stacked leaves ([L, ...]: the base's `layers`, every adapter
factor `a` / `b`) give one unit per layer, other leaves (embeddings, final norm, tag rows) one unit
with layer −1. From the units' (g1·g2, |g1|², |g2|²) follow the angle flattened over all parameters
(the paper's), per tensor (the authors'), and per layer.

    θ = degrees(arccos(clip(g1·g2 / max(|g1| |g2|, ε), −1, 1)))   ε = 1e-12 (the authors')
"""

from __future__ import annotations

import dataclasses
import functools
import re
import zlib

import jax
import jax.numpy as jnp
import numpy as np

EPS = 1e-12
_STACKED = re.compile(r"\['layers'\]|\['(a|b)'\]$")


def unit_names(tree) -> list[tuple[str, bool]]:
    """(tensor name, layer-stacked?) per leaf of `tree`, in leaf order."""
    return [(jax.tree_util.keystr(p), bool(_STACKED.search(jax.tree_util.keystr(p))))
            for p, _ in jax.tree_util.tree_flatten_with_path(tree)[0]]


def _leaf_stats(x, y, stacked: bool):
    """-> (x·y, |x|², |y|²), each [L] for a stacked leaf, else [1]; float32 accumulation."""
    x, y = jnp.asarray(x, jnp.float32), jnp.asarray(y, jnp.float32)
    if stacked:
        x, y = x.reshape(x.shape[0], -1), y.reshape(y.shape[0], -1)
    else:
        x, y = x.reshape(1, -1), y.reshape(1, -1)
    return jnp.sum(x * y, 1), jnp.sum(x * x, 1), jnp.sum(y * y, 1)


_leaf_stats_jit = jax.jit(_leaf_stats, static_argnums=2)


@dataclasses.dataclass
class PairStats:
    """Per unit: tensor name, layer (−1: not layer-stacked), g1·g2, |g1|², |g2|² (float64)."""
    tensor: np.ndarray
    layer: np.ndarray
    dot: np.ndarray
    n1: np.ndarray
    n2: np.ndarray

    def angle(self) -> float:
        """Flattened over every parameter (the paper's θ)."""
        return float(angle(self.dot.sum(), self.n1.sum(), self.n2.sum()))

    def _grouped(self, keys: np.ndarray) -> dict:
        out = {}
        for k in dict.fromkeys(keys.tolist()):
            m = keys == k
            out[k] = float(angle(self.dot[m].sum(), self.n1[m].sum(), self.n2[m].sum()))
        return out

    def per_tensor(self) -> dict[str, float]:
        """Tensor name -> angle over all its layers."""
        return self._grouped(self.tensor)

    def per_layer(self) -> dict[int, float]:
        """Layer -> angle over every tensor of that layer (−1: the non-stacked tensors)."""
        return self._grouped(self.layer)

    def per_unit(self) -> np.ndarray:
        """The angle of each (tensor, layer) unit (the authors' per-parameter cosines)."""
        return angle(self.dot, self.n1, self.n2)


def angle(dot, n1, n2, eps: float = EPS):
    """Degrees between two vectors from their inner product and squared norms."""
    dot, n1, n2 = (np.asarray(v, np.float64) for v in (dot, n1, n2))
    cos = dot / np.maximum(np.sqrt(n1 * n2), eps)
    return np.degrees(np.arccos(np.clip(cos, -1.0, 1.0)))


def pair_stats(g1, g2) -> PairStats:
    """Units of two gradient trees of the same structure, accumulated leaf by leaf."""
    s1, s2 = jax.tree.structure(g1), jax.tree.structure(g2)
    if s1 != s2:
        raise ValueError(f"gradient trees differ in structure: {s1} vs {s2}")
    names = unit_names(g1)
    cols: list[list] = [[], [], [], [], []]
    for (name, stacked), x, y in zip(names, jax.tree.leaves(g1), jax.tree.leaves(g2)):
        if x.shape != y.shape:
            raise ValueError(f"{name}: shapes {x.shape} and {y.shape} differ")
        d, a, b = (np.asarray(v, np.float64) for v in _leaf_stats_jit(x, y, stacked))
        cols[0] += [name] * len(d)
        cols[1] += list(range(len(d))) if stacked else [-1]
        cols[2].append(d)
        cols[3].append(a)
        cols[4].append(b)
    return PairStats(np.asarray(cols[0]), np.asarray(cols[1], np.int64), *(np.concatenate(c) for c in cols[2:]))


# -- many gradients: a seeded sketch ---------------------------------------------------------------
class Sketch:
    """A seeded CountSketch per unit: each coordinate of a unit goes to one of `dim` buckets with a
    random sign, so ⟨S g1, S g2⟩ is an unbiased estimate of g1·g2 with standard deviation about
    |g1||g2|/√dim per unit. G gradients are compared pairwise from G sketches (G × units × dim
    floats) instead of G full gradient trees. Buckets and signs depend only on (seed, tensor name,
    layer), so sketches taken in different processes compare.

    Buckets and signs cost 8 bytes per parameter. They are kept between calls while the tree's total
    stays under `cache_bytes` (SmolLM2-135M: 1.1 GB), else drawn again inside the jitted sketch one
    layer at a time (a 7B backbone's would be 56 GB); both give the same sketch."""

    def __init__(self, dim: int = 4096, seed: int = 0, cache_bytes: float = 2 * 2 ** 30):
        if dim < 1:
            raise ValueError(f"sketch dim {dim}: expected >= 1")
        self.dim, self.seed, self.cache_bytes = int(dim), int(seed), float(cache_bytes)
        self._hash: dict[tuple[str, tuple], tuple[jax.Array, jax.Array]] = {}

    def _key(self, name: str) -> jax.Array:
        return jax.random.fold_in(jax.random.PRNGKey(self.seed), zlib.crc32(name.encode()) & 0x7FFFFFFF)

    def __call__(self, g) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """-> (tensor names [U], layers [U], sketches [U, dim]) of one gradient tree."""
        names, layers, rows = [], [], []
        cache = 8 * sum(x.size for x in jax.tree.leaves(g)) <= self.cache_bytes
        for (name, stacked), x in zip(unit_names(g), jax.tree.leaves(g)):
            x = jnp.asarray(x, jnp.float32)
            x = x.reshape(x.shape[0], -1) if stacked else x.reshape(1, -1)
            if cache:
                if (name, x.shape) not in self._hash:
                    self._hash[(name, x.shape)] = _hashes(self._key(name), x.shape[0], x.shape[1], self.dim)
                rows.append(np.asarray(_scatter(x, *self._hash[(name, x.shape)], self.dim)))
            else:
                rows.append(np.asarray(_sketch_fresh(x, self._key(name), self.dim)))
            names += [name] * x.shape[0]
            layers += list(range(x.shape[0])) if stacked else [-1]
        return np.asarray(names), np.asarray(layers, np.int64), np.concatenate(rows)


def _unit_hash(key: jax.Array, layer, n: int, dim: int):
    kb, ks = jax.random.split(jax.random.fold_in(key, layer))
    return jax.random.randint(kb, (n,), 0, dim, jnp.int32), jax.random.rademacher(ks, (n,), jnp.float32)


@functools.partial(jax.jit, static_argnums=(1, 2, 3))
def _hashes(key, layers: int, n: int, dim: int):
    return jax.vmap(lambda i: _unit_hash(key, i, n, dim))(jnp.arange(layers))


@functools.partial(jax.jit, static_argnums=3)
def _scatter(x, idx, sign, dim: int):
    return jax.vmap(lambda r, i, s: jnp.zeros((dim,), jnp.float32).at[i].add(r * s))(x, idx, sign)


@functools.partial(jax.jit, static_argnums=2)
def _sketch_fresh(x, key, dim: int):
    def one(args):
        r, i = args
        idx, sign = _unit_hash(key, i, r.shape[0], dim)
        return jnp.zeros((dim,), jnp.float32).at[idx].add(r * sign)
    return jax.lax.map(one, (x, jnp.arange(x.shape[0])))


def sketch_stats(names, layers, s1: np.ndarray, s2: np.ndarray) -> PairStats:
    """PairStats of two gradients from their sketches (estimates)."""
    s1, s2 = np.asarray(s1, np.float64), np.asarray(s2, np.float64)
    return PairStats(np.asarray(names), np.asarray(layers), (s1 * s2).sum(1), (s1 * s1).sum(1), (s2 * s2).sum(1))


# -- the authors' statistics (analyze_grad_cos.py) ---------------------------------------------------
def drop_flat_samples(angles: np.ndarray, eps_deg: float = 1.0) -> np.ndarray:
    """Keep-mask over samples (rows of [S, U] per-unit angles): a sample whose every angle is ≤ 1°
    is dropped, as in the authors' `remove_zero_angle_records` (their signal of a zero gradient)."""
    angles = np.asarray(angles, np.float64)
    return np.nanmax(angles, axis=1) > eps_deg


def layer_summary(angles: np.ndarray, layers: np.ndarray) -> dict[int, dict]:
    """Per layer over all samples and that layer's units: median and quartiles of the angle."""
    angles, layers = np.asarray(angles, np.float64), np.asarray(layers)
    out = {}
    for layer in sorted(set(layers.tolist())):
        v = angles[:, layers == layer].ravel()
        v = v[np.isfinite(v)]
        q1, med, q3 = np.percentile(v, [25, 50, 75]) if len(v) else (np.nan,) * 3
        out[layer] = {"median": float(med), "q1": float(q1), "q3": float(q3), "n": int(len(v))}
    return out


def layer_tests(cross: np.ndarray, same: np.ndarray, layers: np.ndarray, min_n: int = 10) -> dict[int, dict]:
    """Per layer, the one-sided Wilcoxon signed-rank test of cross > same on angles paired by
    (sample, unit) — [S, U] arrays with the same rows and columns — when at least `min_n` pairs
    exist (the authors' rule); the median paired difference beside it."""
    from scipy.stats import wilcoxon
    cross, same, layers = np.asarray(cross, np.float64), np.asarray(same, np.float64), np.asarray(layers)
    if cross.shape != same.shape:
        raise ValueError(f"paired angles need one shape: cross {cross.shape}, same {same.shape}")
    out = {}
    for layer in sorted(set(layers.tolist())):
        c, s = cross[:, layers == layer].ravel(), same[:, layers == layer].ravel()
        ok = np.isfinite(c) & np.isfinite(s)
        c, s = c[ok], s[ok]
        p = float("nan")
        if len(c) >= min_n and np.any(c != s):
            p = float(wilcoxon(c, s, alternative="greater").pvalue)
        out[layer] = {"n": int(len(c)), "delta_median": float(np.median(c - s)) if len(c) else float("nan"), "p": p}
    return out


# -- the gradient-alignment stages' helpers (experiments.grad_run) -----------------------------------
# the study's axes: what is differentiated, how gradients are paired, what weights a trajectory's gradient
PARAMS = ("full", "adapters")
GRAD_PROTOCOLS = ("paper", "authors")
WEIGHTINGS = ("advantage", "loglik")


def mixed(acc: np.ndarray) -> bool:
    """A group with at least one right and one wrong answer."""
    acc = np.asarray(acc)
    return bool((acc > 0).any() and (acc <= 0).any())


def pick_subset(acc: np.ndarray, k: int, rng: np.random.Generator) -> np.ndarray:
    """k indices of a mixed group with ≥ 1 right and ≥ 1 wrong (the authors' 5-response batches): one
    right and one wrong drawn first, the rest uniformly from the remaining responses; sorted."""
    acc = np.asarray(acc)
    right, wrong = np.flatnonzero(acc > 0), np.flatnonzero(acc <= 0)
    if not len(right) or not len(wrong) or len(acc) < k:
        raise ValueError(f"a subset of {k} with right and wrong answers needs a mixed group of ≥ {k}")
    first = [int(rng.choice(right)), int(rng.choice(wrong))]
    rest = np.setdiff1d(np.arange(len(acc)), first)
    return np.sort(np.concatenate([first, rng.choice(rest, k - 2, replace=False)])).astype(np.int64)


def paper_pairs(present: np.ndarray, advantages: np.ndarray, weighting: str) -> dict[str, list]:
    """Index pairs into the 2G Gram rows (i < G: reasoning of trajectory i; G + i: its tool) by kind,
    each with the sign flip its weighting implies: [(i, j, flip)]. Under `advantage` a pair with a zero
    advantage is undefined (left out); a same-role pair with advantages of opposite signs is flipped.
    With the role-agnostic control the Gram has 4G rows (2G + i, 3G + i: trajectory i's two random token
    sets of the roles' sizes) and `control` pairs them (within one trajectory: like `cross`, never
    flipped); without it `control` is empty."""
    g = len(advantages)
    adv = np.asarray(advantages, np.float64)
    ok = present.astype(bool)
    if len(ok) not in (2 * g, 4 * g):
        raise ValueError(f"{len(ok)} gradients for {g} trajectories: expected 2G (roles) or 4G (roles + control)")
    usable = lambda i: weighting == "loglik" or adv[i % g] != 0  # noqa: E731
    out: dict[str, list] = {"cross": [], "same_reasoning": [], "same_tool": [], "control": []}
    for i in range(g):
        if ok[i] and ok[g + i] and usable(i):
            out["cross"].append((i, g + i, False))
        if len(ok) == 4 * g and ok[2 * g + i] and ok[3 * g + i] and usable(i):
            out["control"].append((2 * g + i, 3 * g + i, False))
    for kind, off in (("same_reasoning", 0), ("same_tool", g)):
        for i in range(g):
            for j in range(i + 1, g):
                if ok[off + i] and ok[off + j] and usable(i) and usable(j):
                    out[kind].append((off + i, off + j, weighting == "advantage" and adv[i] * adv[j] < 0))
    return out


def flip(theta: np.ndarray, flips) -> np.ndarray:
    theta = np.asarray(theta, np.float64).copy()
    f = np.asarray(flips, bool)
    theta[f] = 180.0 - theta[f]
    return theta


def tree_nbytes(tree) -> int:
    return int(sum(x.size * 4 for x in jax.tree.leaves(tree)))


def exact_gram(trees: list) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """-> (tensor names [U], layers [U], Gram [U, N, N] float64) of N gradient trees (None: a zero
    gradient), leaf by leaf."""
    ref = next(t for t in trees if t is not None)
    names, layers, blocks = [], [], []
    leaves = [jax.tree.leaves(t) if t is not None else None for t in trees]
    for k, (name, stacked) in enumerate(unit_names(ref)):
        shape = jax.tree.leaves(ref)[k].shape
        rows = [jnp.asarray(lv[k], jnp.float32) if lv is not None else jnp.zeros(shape, jnp.float32)
                for lv in leaves]
        x = jnp.stack(rows)
        x = x.reshape(len(rows), shape[0], -1) if stacked else x.reshape(len(rows), 1, -1)
        blocks.append(np.asarray(_gram(x), np.float64))
        names += [name] * x.shape[1]
        layers += list(range(x.shape[1])) if stacked else [-1]
    return np.asarray(names), np.asarray(layers, np.int64), np.concatenate(blocks)


@jax.jit
def _gram(x):
    return jnp.einsum("iln,jln->lij", x, x, precision=jax.lax.Precision.HIGHEST)


def sketch_gram(sketches: list) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """The same from Sketch outputs (None: zero)."""
    ref = next(s for s in sketches if s is not None)
    names, layers, rows = ref
    s = np.stack([x[2] if x is not None else np.zeros_like(rows) for x in sketches]).astype(np.float64)
    return names, layers, np.einsum("iud,jud->uij", s, s)


# -- summaries of many angles (the report's) ---------------------------------------------------------
NEAR_90 = (80.0, 100.0)


def describe(v) -> dict:
    """n, mean, median, quartiles, min and the share within NEAR_90 of an array of angles (non-finite left out)."""
    v = np.asarray(v, np.float64)
    v = v[np.isfinite(v)]
    if not len(v):
        return {"n": 0}
    q1, med, q3 = np.percentile(v, [25, 50, 75])
    return {"n": int(len(v)), "mean": float(v.mean()), "median": float(med), "q1": float(q1), "q3": float(q3),
            "min": float(v.min()), "share_80_100": float(np.mean((v >= NEAR_90[0]) & (v <= NEAR_90[1])))}


def defined_angle(dot, n1, n2) -> np.ndarray:
    """angle, but NaN where both vectors are exactly zero (a LoRA factor A whose B is 0 has no
    gradient in either pass: its angle says nothing, and the authors' ε would call it 90°)."""
    n1, n2 = np.asarray(n1, np.float64), np.asarray(n2, np.float64)
    return np.where((n1 == 0) & (n2 == 0), np.nan, angle(dot, n1, n2))
