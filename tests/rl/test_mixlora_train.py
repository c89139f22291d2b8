"""The MixLoRA baseline end to end (issue 19): one GRPO step of a tiny random Llama with SmolLM2's
tokenizer — the router, experts and attention LoRAs train, the load-balancing loss is in the loss
and the metrics, the checkpoint restores for evaluation; the train step's gradient equals autodiff
of policy loss + aux computed directly; the paper's configs select it."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from configs import paper_qa, paper_sql, quickstart
from dart_jax.adapters.method import MethodSpec, init_adapters
from dart_jax.eval.job import evaluate
from dart_jax.eval.runner import EvalOptions
from dart_jax.models import mixlora
from dart_jax.models.transformer import hidden_states_and_ffn_stats, output_head
from dart_jax.rl import losses
from dart_jax.rl.logprobs import token_logprobs
from dart_jax.rl.step import make_accumulate
from dart_jax.rl.trainer import Trainer
from dart_jax.run.metrics import read_metrics
from dart_jax.run.spec import LossConfig


def _config(model_dir, out_dir):
    c = quickstart.get_config()
    c.model.path = model_dir
    c.warm_start = ""
    c.method.variant, c.method.rank, c.method.alpha = "mixlora", 4, 8.0
    c.method.experts, c.method.top_k, c.method.router_aux_coef = 3, 2, 0.01
    c.train.old_logp = "recompute"
    c.train.share_prefix = False  # the quickstart shares a group's prompt; this method cannot (run.spec)
    c.eval.n = 0
    c.train.steps, c.train.prompts_per_step, c.train.group_size = 1, 2, 2
    c.train.mini_batch, c.train.micro_batch = 4, 2
    c.rollout.max_turns = 1
    c.rollout.max_tokens_per_turn = 12
    c.rollout.max_obs_tokens = 32
    c.rollout.max_response_tokens = 64
    c.loss.entropy_coef = 0.01  # random model: rewards are 0, the entropy term moves the adapters
    c.optim.lr = 1e-2
    c.output.dir = str(out_dir)
    c.output.checkpoint_every = 1
    c.output.progress = c.output.tensorboard = False
    c.mesh.shape = (2, 1, 1)
    return c


def test_mixlora_trains_one_step_and_evaluates_from_its_checkpoint(tiny_smollm_dir, tmp_path):
    c = _config(tiny_smollm_dir, tmp_path / "run")
    tr = Trainer(c)
    assert set(tr.state.params) == {"experts", "shared"}
    assert set(tr.state.params["shared"].params) == {"q", "k", "v", "o"}
    before = jax.tree.map(np.asarray, tr.state.params)
    out = tr.run()
    after = jax.tree.map(np.asarray, tr.state.params)
    row = read_metrics(out["metrics"])[-1]
    # the balanced value of E·Σ f·P is k (= 2): the aux metric is coef × about that
    assert 0.01 * 2 * 0.9 < row["actor/router_aux"] < 0.01 * 3, row["actor/router_aux"]
    moved = {k: not np.allclose(before["experts"].params[k]["b"], after["experts"].params[k]["b"])
             for k in mixlora.FFN}
    assert all(moved.values()), moved
    assert not np.allclose(before["experts"].params["router"], after["experts"].params["router"])
    assert not np.allclose(before["shared"].params["q"]["b"], after["shared"].params["q"]["b"])
    res = evaluate(c, str(tmp_path / "eval"), ["nq"], EvalOptions(limit=2, batch=2, progress=False),
                   checkpoint=str(tmp_path / "run"))
    assert res["setup"]["variant"] == "mixlora" and res["setup"]["step"] == 1
    assert res["datasets"]["nq"]["trajectories"] == 2


def test_the_step_gradient_is_policy_loss_plus_weighted_aux(tiny_smollm_dir):
    """make_accumulate (two micro-batches, token-mean over the mini-batch) against autodiff of the
    loss written out: Σ_micro [Σ_t w_t ℓ_t + (Σ_t w_t) · coef · aux(micro)]."""
    from dart_jax.checkpoints.registry import load_model
    cfg, base = load_model(tiny_smollm_dir)
    method = MethodSpec("mixlora", rank=4, alpha=8.0, experts=2, top_k=1, router_aux_coef=0.5)
    ads = init_adapters(method, cfg, jax.random.PRNGKey(0))
    ads = jax.tree.map(lambda x: x + 0.02, ads)
    lc = LossConfig(kl_coef=0.0, entropy_coef=0.0)
    rng = np.random.default_rng(0)
    M, b, T = 2, 2, 10
    tokens = rng.integers(3, 200, (M, b, T)).astype(np.int32)
    positions = np.tile(np.arange(T, dtype=np.int32), (M, b, 1))
    positions[0, 1, :3] = -1
    mask = np.zeros((M, b, T), np.float32)
    mask[..., 5:] = 1
    mask[1, 0, 5:7] = 0
    routes = np.where(positions < 0, -1, 0).astype(np.int32)
    old = rng.normal(-3, 0.1, (M, b, T)).astype(np.float32)
    batch = {"tokens": tokens, "positions": positions, "route_ids": routes, "loss_mask": mask,
             "loss_roles": np.zeros((M, b, T), np.int32), "old_logp": old, "ref_logp": old,
             "advantages": rng.normal(0, 1, (M, b)).astype(np.float32)}
    batch = {k: jnp.asarray(v) for k, v in batch.items()}
    grads, sums = jax.jit(make_accumulate(cfg, method, lc))(ads, base, batch, jax.random.PRNGKey(1))

    def direct(ads):
        total, auxes = 0.0, []
        n_tok = jnp.sum(batch["loss_mask"])
        for i in range(M):
            h, _, stats = hidden_states_and_ffn_stats(base, ads, batch["tokens"][i], batch["positions"][i],
                                                   batch["route_ids"][i], None, cfg=cfg)
            logp, _ = token_logprobs(h, output_head(base, cfg), batch["tokens"][i], 1.0, 128)
            pg, _ = losses.clipped_policy_loss(logp, batch["old_logp"][i], batch["advantages"][i][:, None],
                                               0.2, 0.2, 3.0)
            m = batch["loss_mask"][i]
            aux = mixlora.load_balancing_loss(stats, 0.5)
            total = total + jnp.sum(m * pg) / n_tok + jnp.sum(m) / n_tok * aux
            auxes.append(jnp.sum(m) / n_tok * aux)
        return total, sum(auxes)

    (want, want_aux), want_g = jax.value_and_grad(direct, has_aux=True)(ads)
    assert float(sums["loss"]) == pytest.approx(float(want), rel=1e-5)
    assert float(sums["router_aux"]) == pytest.approx(float(want_aux), rel=1e-5)
    flat, ref = jax.tree.leaves(grads), jax.tree.leaves(want_g)
    scale = max(float(jnp.abs(g).max()) for g in ref)
    for g, r in zip(flat, ref):
        np.testing.assert_allclose(np.asarray(g), np.asarray(r), atol=1e-5 * scale, rtol=0)


def test_paper_configs_select_mixlora_at_darts_budget():
    for c in (paper_qa.get_config("mixlora,qwen2.5-3b-base"), paper_sql.get_config("mixlora")):
        m = c.method
        assert (m.variant, m.rank, m.alpha, m.experts, m.top_k, m.router_aux_coef) == ("mixlora", 8, 16.0, 2, 2, 0.001)
    with pytest.raises(ValueError, match="top_k"):
        MethodSpec("mixlora", experts=2, top_k=3)
    with pytest.raises(ValueError, match="dropout"):
        MethodSpec("mixlora", dropout=0.05)
