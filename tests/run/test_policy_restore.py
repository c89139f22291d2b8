"""run.policy.restore_trained reads only the parameters of a run's orbax checkpoint and gives the tree
the trainer's own restore gives (TrainState.compute_params of the whole restored state)."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from dart_jax.adapters.method import MethodSpec, init_adapters, trainable
from dart_jax.parallel.mesh import make_mesh
from dart_jax.rl.optim import make_optimizer
from dart_jax.rl.placement import place_state
from dart_jax.run.checkpoint import Checkpointer
from dart_jax.run.loop import checkpoint_tree
from dart_jax.run.policy import restore_trained
from dart_jax.run.source import classify_source
from dart_jax.run.spec import OptimConfig
from tiny_dart import CFG, dart_setup


def _train_state(method, base, adapters, mesh, shift: float):
    """A placed train state whose masters moved by `shift` and whose optimiser state is not the fresh one."""
    state, base = place_state(method, CFG, base, adapters, make_optimizer(OptimConfig()), mesh)
    state = state.replace(params=jax.tree.map(lambda x: x + shift, state.params),
                          opt_state=jax.tree.map(lambda x: x + 1 if jnp.issubdtype(x.dtype, jnp.floating) else x,
                                                 state.opt_state), step=state.step + 3)
    return state, base


@pytest.mark.parametrize("variant", ["dart", "full"])
def test_params_only_restore_equals_the_train_state_restore(tmp_path, variant):
    mesh = make_mesh((1, 1, 1), jax.devices()[:1])
    base, _, _ = dart_setup()
    method = MethodSpec(variant=variant, rank=4, alpha=8.0)
    base = jax.tree.map(lambda x: x.astype(jnp.bfloat16), base)  # masters fp32, compute dtype bf16
    adapters = init_adapters(method, CFG, jax.random.PRNGKey(1))
    state, placed = _train_state(method, base, adapters, mesh, 0.25)
    ckpt = Checkpointer(str(tmp_path / "checkpoints"))
    for step in (1, 2):
        ckpt.save(step, checkpoint_tree(state, jax.random.PRNGKey(step), mesh), {"step": step})
    ckpt.close()
    source = classify_source(str(tmp_path))
    assert (source.kind, source.detail["step"]) == ("orbax", None)
    got_base, got_adapters, step = restore_trained(method, CFG, base, adapters, source, mesh)
    assert step == 2
    want = state.compute_params()
    got = got_base if method.trains_base else got_adapters
    jax.tree.map(lambda g, w: np.testing.assert_array_equal(np.asarray(g), np.asarray(w)), got, want)
    assert jax.tree.map(lambda x: x.dtype, got) == jax.tree.map(lambda x: x.dtype, trainable(method, base, adapters))
    _, _, step = restore_trained(method, CFG, base, adapters, classify_source(str(tmp_path), step=1), mesh)
    assert step == 1
    with pytest.raises(FileNotFoundError, match="no checkpoint for step 7"):
        restore_trained(method, CFG, base, adapters, classify_source(str(tmp_path), step=7), mesh)
