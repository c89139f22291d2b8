"""The 2-Agent baseline (issue 19): two models, one per role — two full models, or two LoRAs over the
frozen base (`agent_params="lora"`). Each model's gradient is exactly zero from the other role's
tokens; a rollout goes through the two-model composition (two identical models give the
single-model trajectory); one trainer step end to end and evaluation from its checkpoint on a tiny
random Llama with SmolLM2's tokenizer."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from configs import paper_qa, quickstart
from dart_jax.adapters.method import MethodSpec, TwoModels, init_adapters, model_trees, routes_for, trainable
from dart_jax.eval.job import evaluate
from dart_jax.eval.runner import EvalOptions
from dart_jax.rl.step import make_accumulate, sequence_logprobs
from dart_jax.rl.trainer import Trainer
from dart_jax.roles.router import REASONING, TOOL
from dart_jax.rollout.agent import Agent, RolloutConfig
from dart_jax.rollout.compose import rollout_policy
from dart_jax.rollout.protocol import QA
from dart_jax.rollout.sampling import SamplingConfig
from dart_jax.rollout.tasks import qa_rows, qa_task
from dart_jax.run.metrics import read_metrics
from dart_jax.run.spec import LossConfig, run_spec
from dart_jax.run.task import build_tool


def _batch(roles_row, M=2, b=2, seed=0):
    rng = np.random.default_rng(seed)
    T = len(roles_row)
    tokens = rng.integers(3, 200, (M, b, T)).astype(np.int32)
    mask = np.zeros((M, b, T), np.float32)
    mask[..., 3:] = 1
    routes = np.tile(np.asarray(roles_row, np.int32), (M, b, 1))
    old = rng.normal(-3, 0.1, (M, b, T)).astype(np.float32)
    return {"tokens": tokens, "positions": np.tile(np.arange(T, dtype=np.int32), (M, b, 1)), "route_ids": routes,
            "loss_mask": mask, "loss_roles": np.zeros((M, b, T), np.int32), "old_logp": old, "ref_logp": old,
            "advantages": rng.normal(0, 1, (M, b)).astype(np.float32)}


@pytest.fixture(scope="module")
def tiny(tiny_smollm_dir):
    from dart_jax.checkpoints.registry import load_model
    return load_model(tiny_smollm_dir)


def test_each_model_learns_from_its_own_roles_tokens_only(tiny):
    cfg, base = tiny
    method = MethodSpec("2agent")
    other = jax.tree.map(lambda x: x * 1.01, base)  # two different models
    params = {"reasoning": base, "tool": other}
    acc = jax.jit(make_accumulate(cfg, method, LossConfig(kl_coef=0.0)))
    # route ids hold roles; token t's loss role (its writer) is the role of position t − 1
    roles = [REASONING] * 5 + [TOOL] * 4 + [REASONING] * 3
    grads, _ = acc(params, base, {k: jnp.asarray(v) for k, v in _batch(roles).items()}, jax.random.PRNGKey(0))
    norms = {k: float(jnp.sqrt(sum(jnp.sum(g ** 2) for g in jax.tree.leaves(v)))) for k, v in grads.items()}
    assert norms["reasoning"] > 0 and norms["tool"] > 0, norms
    # no tool token: the tool model's gradient is exactly zero, and the reasoning model's is what a
    # single full model gets from the same tokens
    only_reas = _batch([REASONING] * 12)
    grads, _ = acc(params, base, {k: jnp.asarray(v) for k, v in only_reas.items()}, jax.random.PRNGKey(0))
    assert all(float(jnp.abs(g).max()) == 0.0 for g in jax.tree.leaves(grads["tool"]))
    single, _ = jax.jit(make_accumulate(cfg, MethodSpec("full"), LossConfig(kl_coef=0.0)))(
        base, base, {k: jnp.asarray(v) for k, v in only_reas.items()}, jax.random.PRNGKey(0))
    for g, s in zip(jax.tree.leaves(grads["reasoning"]), jax.tree.leaves(single)):
        np.testing.assert_allclose(np.asarray(g), np.asarray(s), atol=1e-6 * max(1.0, float(jnp.abs(s).max())))
    # and the other way round
    only_tool = _batch([REASONING] + [TOOL] * 11)
    grads, _ = acc(params, base, {k: jnp.asarray(v) for k, v in only_tool.items()}, jax.random.PRNGKey(0))
    assert all(float(jnp.abs(g).max()) == 0.0 for g in jax.tree.leaves(grads["reasoning"]))


def test_the_two_models_log_probs_follow_the_writer(tiny):
    cfg, base = tiny
    other = jax.tree.map(lambda x: x * 1.01, base)
    b = _batch([REASONING] * 4 + [TOOL] * 4 + [REASONING] * 4, M=1)
    t, p, r = (jnp.asarray(b[k][0]) for k in ("tokens", "positions", "route_ids"))
    both, _ = sequence_logprobs(TwoModels(base, other), None, t, p, r, cfg=cfg, temperature=1.0, chunk=128)
    a, _ = sequence_logprobs(base, None, t, p, None, cfg=cfg, temperature=1.0, chunk=128)
    o, _ = sequence_logprobs(other, None, t, p, None, cfg=cfg, temperature=1.0, chunk=128)
    writer = np.asarray([-1] + [REASONING] * 4 + [TOOL] * 4 + [REASONING] * 3)  # the role of t − 1
    np.testing.assert_array_equal(np.asarray(both)[:, writer == TOOL], np.asarray(o)[:, writer == TOOL])
    np.testing.assert_array_equal(np.asarray(both)[:, writer != TOOL], np.asarray(a)[:, writer != TOOL])


def _perturbed_loras(cfg, seed):
    """Two LoRAs of rank 4 whose B is not zero (a fresh LoRA is the identity)."""
    ads = init_adapters(MethodSpec("2agent", agent_params="lora", rank=4, alpha=8.0), cfg, jax.random.PRNGKey(seed))
    keys = iter(jax.random.split(jax.random.PRNGKey(seed + 1), 1000))
    return jax.tree.map(lambda x: x + 0.05 * jax.random.normal(next(keys), x.shape, x.dtype), ads)


def test_two_lora_agents_learn_from_their_own_roles_tokens_only(tiny):
    cfg, base = tiny
    method = MethodSpec("2agent", agent_params="lora", rank=4, alpha=8.0)
    assert not method.trains_base and method.adapter_names == ("reasoning", "tool")
    params = _perturbed_loras(cfg, 3)
    acc = jax.jit(make_accumulate(cfg, method, LossConfig(kl_coef=0.0)))
    roles = [REASONING] * 5 + [TOOL] * 4 + [REASONING] * 3
    grads, _ = acc(params, base, {k: jnp.asarray(v) for k, v in _batch(roles).items()}, jax.random.PRNGKey(0))
    assert all(float(jnp.sqrt(sum(jnp.sum(g ** 2) for g in jax.tree.leaves(grads[k])))) > 0
               for k in ("reasoning", "tool"))
    # no tool token: the tool LoRA's gradient is exactly zero, and the reasoning LoRA's is what one
    # LoRA on every token (method "lora") gets from the same tokens
    only_reas = {k: jnp.asarray(v) for k, v in _batch([REASONING] * 12).items()}
    grads, _ = acc(params, base, only_reas, jax.random.PRNGKey(0))
    assert all(float(jnp.abs(g).max()) == 0.0 for g in jax.tree.leaves(grads["tool"]))
    lora = MethodSpec("lora", rank=4, alpha=8.0)
    single, _ = jax.jit(make_accumulate(cfg, lora, LossConfig(kl_coef=0.0)))(
        {"shared": params["reasoning"]}, base, dict(only_reas, route_ids=routes_for(lora, only_reas["route_ids"])),
        jax.random.PRNGKey(0))
    for g, s in zip(jax.tree.leaves(grads["reasoning"]), jax.tree.leaves(single["shared"])):
        np.testing.assert_allclose(np.asarray(g), np.asarray(s), atol=1e-6 * max(1.0, float(jnp.abs(s).max())))
    only_tool = {k: jnp.asarray(v) for k, v in _batch([REASONING] + [TOOL] * 11).items()}
    grads, _ = acc(params, base, only_tool, jax.random.PRNGKey(0))
    assert all(float(jnp.abs(g).max()) == 0.0 for g in jax.tree.leaves(grads["reasoning"]))


def test_two_lora_agents_log_probs_are_each_models_own_forward(tiny):
    """Each model applies its LoRA to every token of its own forward (not DART's per-token routing
    inside one forward): token t's log-prob is the writer's full forward."""
    cfg, base = tiny
    method = MethodSpec("2agent", agent_params="lora", rank=4, alpha=8.0)
    params = _perturbed_loras(cfg, 5)
    models, ads = model_trees(method, params, base, None)
    assert isinstance(models, TwoModels) and ads is None and models.reasoning is base
    b = _batch([REASONING] * 4 + [TOOL] * 4 + [REASONING] * 4, M=1)
    t, p, r = (jnp.asarray(b[k][0]) for k in ("tokens", "positions", "route_ids"))
    both, _ = sequence_logprobs(models, None, t, p, r, cfg=cfg, temperature=1.0, chunk=128)
    every = jnp.zeros_like(r)  # route 0 on every token: the one LoRA of that model
    a, _ = sequence_logprobs(base, {"shared": params["reasoning"]}, t, p, every, cfg=cfg, temperature=1.0, chunk=128)
    o, _ = sequence_logprobs(base, {"shared": params["tool"]}, t, p, every, cfg=cfg, temperature=1.0, chunk=128)
    writer = np.asarray([-1] + [REASONING] * 4 + [TOOL] * 4 + [REASONING] * 3)
    np.testing.assert_array_equal(np.asarray(both)[:, writer == TOOL], np.asarray(o)[:, writer == TOOL])
    np.testing.assert_array_equal(np.asarray(both)[:, writer != TOOL], np.asarray(a)[:, writer != TOOL])
    # and it is not DART: one forward routing each token to its role's adapter differs
    dart, _ = sequence_logprobs(base, params, t, p, r, cfg=cfg, temperature=1.0, chunk=128)
    assert float(jnp.abs(dart - both)[:, writer == TOOL].max()) > 1e-4


def test_two_identical_models_roll_out_the_single_model_trajectory(tiny_smollm_dir):
    from configs import evaluate as eval_config
    from dart_jax.eval.policy import load_eval_policy
    from dart_jax.run.policy import run_mesh
    c = eval_config.get_config("qa")
    c.model.path = tiny_smollm_dir
    c.retriever.topk = 1
    c.mesh.shape = (1, 1, 1)
    policy = load_eval_policy(run_spec(c), run_mesh(run_spec(c)))
    cfg, base, tok = policy.cfg, policy.base, policy.tokenizer
    agent = Agent(cfg, tok, QA, build_tool(run_spec(c), QA), SamplingConfig(temperature=1.0),
                  RolloutConfig(max_turns=2, max_tokens_per_turn=12, max_obs_tokens=32, max_response_tokens=64,
                                invalid_action="search_r1", route_mode="none"))
    prompts, uids, metas = qa_task(tok, qa_rows(n=3))
    one = rollout_policy(agent, base, None, prompts, uids, metas, seed=7)
    two = rollout_policy(agent, TwoModels(base, base), None, prompts, uids, metas, seed=7)
    assert one.response_text == two.response_text
    np.testing.assert_array_equal(one.ids, two.ids)
    np.testing.assert_allclose(one.sampler_logprobs, two.sampler_logprobs, atol=1e-5)


@pytest.mark.parametrize("agent_params", ["full", "lora"])
def test_two_agent_trains_one_step_and_evaluates_from_its_checkpoint(tiny_smollm_dir, tmp_path, agent_params):
    c = quickstart.get_config()
    c.model.path = tiny_smollm_dir
    c.warm_start = ""
    c.method.variant = "2agent"
    c.method.agent_params = agent_params
    c.train.old_logp = "recompute"
    c.train.share_prefix = False  # the quickstart shares a group's prompt; this method cannot (run.spec)
    c.eval.n = 0
    c.train.steps, c.train.prompts_per_step, c.train.group_size = 1, 2, 2
    c.train.mini_batch, c.train.micro_batch = 4, 2
    c.rollout.max_turns, c.rollout.max_tokens_per_turn = 1, 12
    c.rollout.max_obs_tokens, c.rollout.max_response_tokens = 32, 64
    c.loss.entropy_coef, c.optim.lr = 0.01, 1e-3
    c.optim.weight_decay = 0.0  # decoupled decay moves a model whose gradient is zero
    c.output.dir = str(tmp_path / "run")
    c.output.checkpoint_every = 1
    c.output.progress = c.output.tensorboard = False
    c.mesh.shape = (2, 1, 1)
    tr = Trainer(c)
    assert set(tr.state.params) == {"reasoning", "tool"}
    before = jax.tree.map(np.asarray, tr.state.params)
    out = tr.run()
    after = jax.tree.map(np.asarray, tr.state.params)
    row = read_metrics(out["metrics"])[-1]
    moved = {k: any(not np.array_equal(x, y) for x, y in zip(jax.tree.leaves(before[k]), jax.tree.leaves(after[k])))
             for k in ("reasoning", "tool")}
    assert moved["reasoning"] and row["tokens/reasoning"] > 0
    assert moved["tool"] == (row["tokens/tool"] > 0), (moved, row["tokens/tool"])
    if agent_params == "lora":
        # an evaluation config naming another method whose tree has the same shape (DART's routed pair):
        # the checkpoint is evaluated as the method its run was trained with
        c.method.variant, c.method.agent_params = "dart", "full"
    res = evaluate(c, str(tmp_path / "eval"), ["nq"], EvalOptions(limit=2, batch=2, progress=False),
                   checkpoint=str(tmp_path / "run"))
    assert res["setup"]["variant"] == "2agent" and res["datasets"]["nq"]["trajectories"] == 2
    assert res["setup"]["agent_params"] == agent_params
    if agent_params == "lora":  # the frozen base is held once and not trained
        assert set(tr.state.params["reasoning"].params) == set(c.method.targets)


def test_two_agent_refuses_the_authors_router_convention(tmp_path):
    c = quickstart.get_config()
    c.method.variant = "2agent"
    c.router.convention = "authors"
    c.train.share_prefix = False  # the quickstart shares a group's prompt; this method cannot (run.spec)
    with pytest.raises(ValueError, match="needs router.convention='dart_jax'"):
        Trainer(c)


def test_paper_config_and_trees():
    c = paper_qa.get_config("2agent,qwen2.5-3b-base")
    assert c.method.variant == "2agent" and c.optim.lr == 1e-6
    spec = MethodSpec("2agent")
    assert spec.trains_base and spec.adapter_names == ()
    base = {"w": jnp.ones(2)}
    params = trainable(spec, base, None)
    assert set(params) == {"reasoning", "tool"}
    models, ads = model_trees(spec, params, base, None)
    assert isinstance(models, TwoModels) and ads is None
    c = paper_qa.get_config("2agent_lora,qwen2.5-3b-base")
    assert (c.method.variant, c.method.agent_params, c.method.rank, c.optim.lr) == ("2agent", "lora", 8, 1e-5)
    with pytest.raises(ValueError, match="agent_params='lora' is a 2-Agent option"):
        MethodSpec("dart", agent_params="lora")
