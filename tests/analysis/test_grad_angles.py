"""Gradient-angle maths (dart_jax/analysis/grad_angles.py) on constructed trees: exact angles,
aggregation per tensor / per layer by hand, the seeded sketch against exact angles, the authors'
filters and per-layer tests on hand-made data. Tolerances: 1e-6° for exact constructions in
float32 accumulation, ±2° for the sketch (dim 16384: one standard deviation ≈ 0.45° at 90°)."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from dart_jax.analysis import grad_angles as ga


def _tree(rng, scale=1.0):
    """A base-like tree: layer-stacked q / down under `layers`, an embedding, and an adapter."""
    return {"embed": jnp.asarray(rng.normal(size=(50, 8)) * scale, jnp.float32),
            "layers": {"q": jnp.asarray(rng.normal(size=(3, 8, 2, 4)), jnp.float32),
                       "down": jnp.asarray(rng.normal(size=(3, 12, 8)), jnp.float32)},
            "adapter": {"q": {"a": jnp.asarray(rng.normal(size=(3, 8, 2)), jnp.float32),
                              "b": jnp.asarray(rng.normal(size=(3, 2, 2, 4)), jnp.float32)}}}


def _rotate(g, h, theta_deg):
    """cos θ ĝ + sin θ ĥ⊥ scaled to |g|, with ĥ⊥ the part of h orthogonal to g, as a tree."""
    flat = lambda t: jnp.concatenate([x.ravel() for x in jax.tree.leaves(t)])  # noqa: E731
    a, b = np.asarray(flat(g), np.float64), np.asarray(flat(h), np.float64)
    b = b - a * (a @ b) / (a @ a)
    b = b * np.linalg.norm(a) / np.linalg.norm(b)
    t = np.radians(theta_deg)
    v = np.cos(t) * a + np.sin(t) * b
    leaves, out, i = jax.tree.leaves(g), [], 0
    for x in leaves:
        out.append(jnp.asarray(v[i:i + x.size].reshape(x.shape), jnp.float32))
        i += x.size
    return jax.tree.unflatten(jax.tree.structure(g), out)


def test_units_and_exact_angles():
    rng = np.random.default_rng(0)
    g = _tree(rng)
    names = dict(ga.unit_names(g))
    assert names["['layers']['q']"] and names["['adapter']['q']['a']"] and not names["['embed']"]
    s = ga.pair_stats(g, g)
    assert len(s.dot) == 1 + 3 + 3 + 3 + 3  # embed once, four stacked tensors × 3 layers
    assert s.angle() == 0.0 and all(v == 0.0 for v in s.per_tensor().values())
    neg = jax.tree.map(lambda x: -x, g)
    assert ga.pair_stats(g, neg).angle() == pytest.approx(180.0, abs=1e-3)
    for theta in (10.0, 45.0, 90.0, 135.0):
        assert ga.pair_stats(g, _rotate(g, _tree(rng), theta)).angle() == pytest.approx(theta, abs=1e-3)
    with pytest.raises(ValueError, match="structure"):
        ga.pair_stats(g, {"embed": g["embed"]})


def test_orthogonal_by_construction_and_aggregation_by_hand():
    # g1 lives on layer 0 and the embedding, g2 on layer 1 and the embedding's other half: 90° everywhere
    # they overlap in a unit, and units where one side is zero give 90° (cos 0 over ε)
    e1 = jnp.zeros((4, 2)).at[:2].set(1.0)
    e2 = jnp.zeros((4, 2)).at[2:].set(1.0)
    q1 = jnp.zeros((2, 3)).at[0].set(jnp.array([1.0, 2.0, 2.0]))
    q2 = jnp.zeros((2, 3)).at[1].set(jnp.array([2.0, 0.0, 0.0]))
    s = ga.pair_stats({"embed": e1, "layers": {"q": q1}}, {"embed": e2, "layers": {"q": q2}})
    assert s.angle() == pytest.approx(90.0, abs=1e-6)
    assert s.per_layer() == pytest.approx({-1: 90.0, 0: 90.0, 1: 90.0}, abs=1e-6)
    # hand-worked mixed case: layer 0 of q parallel, layer 1 of q anti-parallel with twice the norm
    a = {"layers": {"q": jnp.array([[1.0, 0.0], [0.0, 1.0]])}}
    b = {"layers": {"q": jnp.array([[3.0, 0.0], [0.0, -2.0]])}}
    s = ga.pair_stats(a, b)
    np.testing.assert_allclose(s.dot, [3.0, -2.0])
    np.testing.assert_allclose(s.per_unit(), [0.0, 180.0], atol=1e-6)
    # flattened: (3 − 2) / (√2 · √13)
    assert s.angle() == pytest.approx(np.degrees(np.arccos(1 / np.sqrt(26))), abs=1e-6)
    assert s.per_tensor() == pytest.approx({"['layers']['q']": np.degrees(np.arccos(1 / np.sqrt(26)))}, abs=1e-6)


def test_sketch_estimates_angles_within_two_degrees_and_is_seeded():
    rng = np.random.default_rng(1)
    big = lambda: {"embed": jnp.asarray(rng.normal(size=(4096, 96)), jnp.float32),  # noqa: E731
                   "layers": {"q": jnp.asarray(rng.normal(size=(4, 96, 256)), jnp.float32)}}
    g = big()
    sk = ga.Sketch(dim=16384, seed=0)
    n0, l0, s0 = sk(g)
    for theta in (30.0, 60.0, 90.0, 120.0):
        h = _rotate(g, big(), theta)
        exact = ga.pair_stats(g, h)
        n1, l1, s1 = sk(h)
        assert (n1 == n0).all() and (l1 == l0).all()
        est = ga.sketch_stats(n0, l0, s0, s1)
        assert abs(est.angle() - exact.angle()) < 2.0, (theta, est.angle(), exact.angle())
    # same seed in a fresh sketch object: the same numbers; another seed: different buckets
    np.testing.assert_array_equal(ga.Sketch(dim=16384, seed=0)(g)[2], s0)
    assert not np.array_equal(ga.Sketch(dim=16384, seed=1)(g)[2], s0)
    # buckets drawn inside the jitted sketch (a tree too big to cache them) give the same sketch
    np.testing.assert_allclose(ga.Sketch(dim=16384, seed=0, cache_bytes=0)(g)[2], s0, rtol=1e-6, atol=1e-5)
    # a sketch preserves squared norms in expectation: within a few percent here
    np.testing.assert_allclose((s0.astype(np.float64) ** 2).sum(), ga.pair_stats(g, g).n1.sum(), rtol=0.05)


def test_authors_filters_and_layer_tests_on_hand_made_data():
    angles = np.array([[0.5, 0.9, 0.0], [0.5, 30.0, 80.0], [np.nan, 1.0, 0.2]])
    np.testing.assert_array_equal(ga.drop_flat_samples(angles), [False, True, False])
    layers = np.array([0, 0, 1])
    summ = ga.layer_summary(np.array([[10.0, 20.0, 5.0], [30.0, 40.0, 7.0]]), layers)
    assert summ[0] == {"median": 25.0, "q1": 17.5, "q3": 32.5, "n": 4}
    assert summ[1]["median"] == 6.0 and summ[1]["n"] == 2
    rng = np.random.default_rng(2)
    same = rng.uniform(20, 40, size=(12, 2))
    cross = same + rng.uniform(5, 15, size=(12, 2))  # cross above same in every pair of layer 0 and 1
    lay = np.array([0, 1])
    t = ga.layer_tests(cross, same, lay)
    assert t[0]["n"] == 12 and t[0]["p"] < 1e-3 and t[0]["delta_median"] > 5
    rev = ga.layer_tests(same, cross, lay)
    assert rev[1]["p"] > 0.99  # one-sided: cross > same is not supported when it is the other way
    few = ga.layer_tests(cross[:9], same[:9], lay)
    assert few[0]["n"] == 9 and np.isnan(few[0]["p"])  # fewer than 10 pairs: no test (the authors' rule)
    with pytest.raises(ValueError, match="one shape"):
        ga.layer_tests(cross, same[:5], lay)


def test_routed_shares_by_hand():
    """DART's two adapters: the share of each role's squared gradient norm on its own adapter, from Gram
    diagonals. G = 2 trajectories; columns (reasoning 0, reasoning 1, tool 0, tool 1); four units."""
    from dart_jax.analysis.grad_report import routed_shares
    names = np.asarray(["['reasoning'].params['q']['a']", "['reasoning'].params['q']['b']",
                        "['tool'].params['q']['a']", "['tool'].params['q']['b']"])
    sq = np.asarray([[3.0, 1.0, 1.0, 0.0],    # per unit: squared norms of the four gradients
                     [1.0, 1.0, 1.0, 2.0],
                     [0.0, 1.0, 2.0, 1.0],
                     [0.0, 1.0, 4.0, 1.0]])
    gram = np.stack([np.diag(row) for row in sq])
    gram[0, 0, 2] = gram[0, 2, 0] = np.sqrt(3.0)  # unit 0: reasoning 0 and tool 0 parallel there
    rec = {"names": names, "gram": gram, "present": np.asarray([True, True, True, False])}
    out = routed_shares([rec])
    assert out["reasoning"]["n"] == 2 and out["reasoning"]["median"] == pytest.approx((4 / 4 + 2 / 4) / 2)
    assert out["tool"]["n"] == 1 and out["tool"]["median"] == pytest.approx(6 / 8)   # tool 1 has no tokens
    assert out["reasoning"]["min"] == pytest.approx(0.5)
    # cross-role angle of trajectory 0 on the reasoning adapter's units: √3 / (√4 · √2)
    on = out["cross_on"]
    assert on["reasoning"]["n"] == 1 and on["reasoning"]["median"] == pytest.approx(
        np.degrees(np.arccos(np.sqrt(3.0) / (2.0 * np.sqrt(2.0)))))
    assert on["tool"]["median"] == pytest.approx(90.0)   # reasoning 0 has nothing on the tool adapter
    shared = {"names": np.asarray(["['shared'].params['q']['a']"] * 4), "gram": gram, "present": rec["present"]}
    assert routed_shares([shared]) is None   # not DART's adapters: nothing to say


def test_authors_routed_by_hand():
    """The authors' statistics on each of DART's two adapters: flattened over one adapter's units (all
    samples) and per tensor over the kept samples. Two samples, four units; sample 1 has identical
    gradients everywhere (every angle 0°), so the authors' rule drops it from the per-tensor view."""
    from dart_jax.analysis.grad_report import authors_routed
    names = np.asarray(["['reasoning'].params['q']['a']", "['reasoning'].params['q']['b']",
                        "['tool'].params['q']['a']", "['tool'].params['q']['b']"])
    one = np.ones(4)
    s0 = {"advantage_cross_dot": np.asarray([1.0, 0.0, 2.0, 0.0]),
          "advantage_cross_n1": np.asarray([1.0, 1.0, 4.0, 1.0]),
          "advantage_cross_n2": one, "advantage_same_dot": np.zeros(4), "advantage_same_n1": one,
          "advantage_same_n2": one}
    s1 = {k: one for k in s0}
    out = authors_routed([{"names": names, **s0}, {"names": names, **s1}], "advantage")
    # sample 0, reasoning units: dot 1, |a|² 2, |b|² 2 -> cos 1/2 -> 60°; tool units: 2 / √(5·2)
    assert out["reasoning"]["flattened"]["cross"]["n"] == 2
    assert out["reasoning"]["flattened"]["cross"]["median"] == pytest.approx((60.0 + 0.0) / 2)
    assert out["tool"]["flattened"]["cross"]["median"] == pytest.approx(
        np.degrees(np.arccos(2 / np.sqrt(10.0))) / 2)
    assert out["tool"]["flattened"]["same"]["median"] == pytest.approx((90.0 + 0.0) / 2)
    # per tensor, kept sample 0 only: cross units (0°, 90°) on each adapter, same all 90°
    for role in ("reasoning", "tool"):
        pt = out[role]["per_tensor"]
        assert pt["cross"]["n"] == 2 and pt["cross"]["median"] == pytest.approx(45.0)
        assert pt["same"]["median"] == pytest.approx(90.0)
    shared = {"names": np.asarray(["['shared'].params['q']['a']"] * 4), **s0}
    assert authors_routed([shared], "advantage") is None
