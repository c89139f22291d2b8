"""The SFT objective and loop on a tiny random Llama with SmolLM2's tokenizer: the loss is the masked
token-mean NLL (numpy recomputation), `launch.sft` lowers held-out NLL and exports a warm-start
directory, and a GRPO run with `warm_start` starts exactly at the warm-started policy."""

import dataclasses
import json
import os
import subprocess
import sys

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from configs import quickstart
from dart_jax.adapters.method import MethodSpec, init_adapters
from dart_jax.checkpoints.dart_io import export_dart, import_dart
from dart_jax.checkpoints.registry import load_model, load_tagged_model
from dart_jax.models.transformer import forward
from dart_jax.rl import batch as batch_lib
from dart_jax.rl.optim import make_optimizer
from dart_jax.rl.step import SFT_KEYS, init_state, make_scorer, make_train_step
from dart_jax.roles.router import RouterSpec
from dart_jax.run.policy import load_policy
from dart_jax.run.spec import LossConfig, OptimConfig, run_spec
from dart_jax.sft import demos as D
from dart_jax.tokenization.sentinels import row_params, sentinel_ids
from xla_env import xla_flags

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def _dart_spec(c):
    """The run spec of config `c` with the default DART method (what the policy loads here)."""
    return dataclasses.replace(run_spec(c), method=MethodSpec(variant="dart"))


def _demo(i, answer):
    return {"id": f"d{i}", "task": "qa", "question": f"question number {i}", "golden_answers": [answer],
            "pieces": [{"text": f"<think> look up {i} </think>\n<search> question {i} </search>", "loss": 1},
                       {"text": f"\n\n<information>Doc 1(Title: \"T{i}\") the answer is {answer}</information>\n\n",
                        "loss": 0},
                       {"text": f"<think> Doc 1 answers. </think>\n<answer> {answer} </answer>", "loss": 1}]}


def test_sft_loss_is_masked_token_mean_nll(tiny_smollm_dir):
    """Two micro-batches, numpy recomputation of Σ mask·(−log p) / Σ mask from teacher-forced log-probs."""
    cfg, base, tok = load_tagged_model(tiny_smollm_dir, jax.random.PRNGKey(0))
    method = MethodSpec(variant="lora", rank=4, alpha=8.0, init_std=0.1)
    ads = init_adapters(method, cfg, jax.random.PRNGKey(1))
    ads = {k: dataclasses.replace(a, params=jax.tree.map(lambda x: x + 0.05, a.params)) for k, a in ads.items()}
    ids = sentinel_ids(tok, ("<search>", "</search>"))
    router = RouterSpec((ids["<search>"],), (ids["</search>"],))
    enc = [D.encode_demo(tok, _demo(i, a), 64) for i, a in enumerate(["red", "blue sky", "1912", "Paris"])]
    arrays = batch_lib.token_arrays(*D.pack_rows(enc), method, router, 16)
    assert arrays["loss_mask"].sum() == sum(sum(m) for _, _, m in enc)  # obs and prompt tokens carry mask 0
    lc = LossConfig(objective="sft", kl_coef=0.0)
    oc = OptimConfig(lr=0.1, warmup_steps=0)
    opt = make_optimizer(oc)
    row_ids = tuple(sentinel_ids(tok).values())
    step = jax.jit(make_train_step(cfg, method, lc, oc, row_ids))
    batch = {k: jnp.asarray(arrays[k]).reshape((2, 2) + arrays[k].shape[1:]) for k in SFT_KEYS}
    rows = row_params(base, cfg, row_ids)
    state, m = step(init_state({"adapters": ads, "rows": rows}, opt), base, batch, jax.random.PRNGKey(0), 0)
    # the tag rows train with the adapters (the demos use <search> / </search> / <information> ...)
    moved = np.abs(np.asarray(state.params["rows"]["embed"] - rows["embed"])).max(axis=1)
    assert (moved > 0).sum() >= 3, moved
    logp = np.asarray(make_scorer(cfg, 1.0, 128)(base, ads, jnp.asarray(arrays["tokens"]),
                                                 jnp.asarray(arrays["positions"]), jnp.asarray(arrays["route_ids"])))
    want = float(-(logp * arrays["loss_mask"]).sum() / arrays["loss_mask"].sum())
    np.testing.assert_allclose(float(m["loss"]), want, rtol=1e-5)
    np.testing.assert_allclose(float(m["nll"]), want, rtol=1e-5)


def _sft_args(model_dir, out, extra=()):
    return [sys.executable, "-m", "launch.sft", "--config=configs/sft_quickstart.py",
            f"--config.model.path={model_dir}", f"--config.output.dir={out}", "--config.sft.data[0].limit=24",
            "--config.sft.val_size=4", "--config.sft.epochs=3", "--config.sft.batch_size=4",
            "--config.sft.micro_batch=2", "--config.sft.protocol_check=2", "--config.sft.eval_every=5",
            "--config.sft.export_dtype=float32", "--config.optim.lr=3e-2", "--config.optim.warmup_steps=0",
            "--config.rollout.max_tokens_per_turn=8", "--config.output.progress=False",
            "--config.output.tensorboard=False", *extra]


@pytest.mark.slow  # CI budget: kept out of the default run (python -m pytest -m slow)
def test_launch_sft_then_grpo_starts_at_the_warm_started_policy(tiny_smollm_dir, tmp_path):
    out = tmp_path / "sft"
    env = dict(os.environ, XLA_FLAGS=xla_flags(1), JAX_PLATFORMS="cpu")
    run = subprocess.run(_sft_args(tiny_smollm_dir, out), cwd=ROOT, env=env, capture_output=True, text=True,
                         timeout=900)
    assert run.returncode == 0, run.stderr[-3000:]
    summary = json.loads((out / "sft_summary.json").read_text())
    assert summary["after"]["val_nll"] < summary["before"]["val_nll"] - 0.5, summary
    assert "held-out NLL" in run.stdout and (out / "sft_curve.png").is_file()
    assert summary["data"]["excluded_eval_questions"] == 0 and summary["data"]["eval_questions_checked"] == 1000
    manifest = json.loads((out / "warm_start" / "dart_adapters.json").read_text())
    assert manifest["kind"] == "warm_start" and manifest["adapters"] == ["shared"]
    train_ids = {json.loads(line)["id"] for line in open(out / "demos.jsonl")}
    val_ids = {json.loads(line)["id"] for line in open(out / "demos_val.jsonl")}
    assert len(val_ids) == 4 and not train_ids & val_ids

    # the GRPO run: base + merged warm start, fresh DART adapters (B = 0) == the SFT policy
    c = quickstart.get_config()
    c.model.path = tiny_smollm_dir
    c.warm_start = str(out / "warm_start")
    cfg, merged, tok, dart = load_policy(_dart_spec(c), None, jax.random.PRNGKey(0))
    cfg0, base0 = load_model(tiny_smollm_dir)
    ws, _, base0, cfg0, _ = import_dart(str(out / "warm_start"), base0, cfg0)
    enc = [D.encode_demo(tok, json.loads(line), 192) for line in open(out / "demos_val.jsonl")]
    ids, pos, _ = D.pack_rows(enc)
    routes0 = np.where(pos >= 0, 0, -1)
    want, _ = forward(base0, ws, jnp.asarray(ids), jnp.asarray(pos), jnp.asarray(routes0), None, cfg=cfg0)
    got, _ = forward(merged, dart, jnp.asarray(ids), jnp.asarray(pos), jnp.asarray(routes0), None, cfg=cfg)
    plain, _ = forward(base0, None, jnp.asarray(ids), jnp.asarray(pos), None, None, cfg=cfg0)
    valid = pos >= 0
    assert np.abs(np.asarray(want - plain))[valid].max() > 1e-2  # the warm start changed the model
    # ... including the tag rows (seeded from their words at load, then trained)
    _, seeded, stok = load_tagged_model(tiny_smollm_dir, jax.random.fold_in(jax.random.PRNGKey(0), 0))
    tag_ids = list(sentinel_ids(stok).values())
    assert np.abs(np.asarray(merged["embed"])[tag_ids] - np.asarray(seeded["embed"])[tag_ids]).max() > 1e-3
    np.testing.assert_allclose(np.asarray(got)[valid], np.asarray(want)[valid], atol=2e-4)

    # DART adapters trained on top of that warm start come back through init_from + warm_start
    c.init_from = export_dart(str(tmp_path / "dart"), dart, cfg, merged, tok,
                              extra={"kind": "dart", "warm_start": c.warm_start})
    _, merged2, _, dart2 = load_policy(_dart_spec(c), None, jax.random.PRNGKey(1))
    again, _ = forward(merged2, dart2, jnp.asarray(ids), jnp.asarray(pos), jnp.asarray(routes0), None, cfg=cfg)
    np.testing.assert_allclose(np.asarray(again)[valid], np.asarray(got)[valid], atol=1e-5)

    # resume continues the SFT run to more epochs from its checkpoint
    # 4 epochs stretch the cosine schedule that spans the SFT length (optim.total_steps=0): a change to allow
    more = subprocess.run(_sft_args(tiny_smollm_dir, out, ["--config.sft.epochs=4", "--resume",
                                                          "--allow-change=sft.epochs"]), cwd=ROOT,
                          env=env, capture_output=True, text=True, timeout=900)
    assert more.returncode == 0, more.stderr[-3000:]
    assert "resumed SFT from checkpoint" in more.stderr


def test_policy_loading_refuses_mismatched_directories(tmp_path):
    c = quickstart.get_config()
    dart_dir = tmp_path / "dart"
    dart_dir.mkdir()
    (dart_dir / "dart_adapters.json").write_text(json.dumps({"kind": "dart", "warm_start": "data/warm_start/x"}))
    c.warm_start = str(dart_dir)
    c.init_from = ""
    with pytest.raises(ValueError, match="not a warm-start directory"):
        load_policy(_dart_spec(c), None, jax.random.PRNGKey(0))
    c.warm_start = ""
    c.init_from = str(dart_dir)
    with pytest.raises(ValueError, match="trained on top of warm_start='data/warm_start/x'"):
        load_policy(_dart_spec(c), None, jax.random.PRNGKey(0))
    c.warm_start = str(tmp_path / "missing")
    c.init_from = ""
    with pytest.raises(FileNotFoundError, match="not an adapter directory"):
        load_policy(_dart_spec(c), None, jax.random.PRNGKey(0))


def test_shipped_warm_start_merges_into_smollm2(tmp_path):
    """The quickstart's warm start: a float16 PEFT adapter + tag rows that import onto the real model."""
    c = quickstart.get_config()
    path = os.path.join(ROOT, c.warm_start)
    manifest = json.loads(open(os.path.join(path, "dart_adapters.json")).read())
    assert manifest["kind"] == "warm_start" and manifest["base_model"] == "smollm2-135m-instruct"
    cfg, base = load_model("smollm2-135m-instruct")
    ads, _, base2, cfg2, tok = import_dart(path, base, cfg)
    assert cfg2.vocab_size > cfg.vocab_size and set(ads) == {"shared"}
    assert ads["shared"].rank == 8 and set(ads["shared"].params) == {"q", "k", "v", "o", "gate", "up", "down"}
    # the exported directory round-trips through our own writer
    again, _, _, _, _ = import_dart(export_dart(str(tmp_path / "rt"), ads, cfg2, base2, tok, dtype="float16"),
                                    base, cfg)
    for t in ads["shared"].params:
        np.testing.assert_array_equal(np.asarray(again["shared"].params[t]["a"]),
                                      np.asarray(ads["shared"].params[t]["a"]))


@pytest.mark.parametrize("variant", ["dart", "full"])
def test_sft_variants_export_what_later_runs_load(tiny_smollm_dir, tmp_path, variant):
    """variant dart -> a DART directory (`init_from`); full -> an HF model directory."""
    from configs import sft_quickstart
    from dart_jax.sft.trainer import SFTTrainer
    D.write_demos(str(tmp_path / "d.jsonl"), [_demo(i, a) for i, a in enumerate(["red", "blue", "1912", "Paris",
                                                                                  "Rome", "green", "1066", "Oslo"])])
    c = sft_quickstart.get_config()
    c.model.path = tiny_smollm_dir
    c.method.variant = variant
    c.sft.data = [dict(builder="file", path=str(tmp_path / "d.jsonl"))]
    c.sft.update(dict(val_size=2, batch_size=2, micro_batch=1, epochs=1, protocol_check=0, eval_every=100,
                      export_dtype="float32"))
    c.output.update(dict(dir=str(tmp_path / variant), progress=False, tensorboard=False))
    tr = SFTTrainer(c)
    assert tr.row_ids == (() if variant == "full" else tuple(sentinel_ids(tr.tok).values()))
    out = tr.run()
    assert out["summary"]["train_demos"] == 7 and out["summary"]["steps"] == 3  # 1 held out (a fifth at most)
    if variant == "dart":
        manifest = json.loads(open(os.path.join(out["export"], "dart_adapters.json")).read())
        assert manifest["kind"] == "dart" and manifest["adapters"] == ["reasoning", "tool"]
        g = quickstart.get_config()
        g.model.path, g.warm_start, g.init_from = tiny_smollm_dir, "", out["export"]
        _, _, _, ads = load_policy(_dart_spec(g), None, jax.random.PRNGKey(0))
        assert set(ads) == {"reasoning", "tool"}
    else:
        assert os.path.isfile(os.path.join(out["export"], "config.json"))
        cfg, _ = load_model(out["export"])
        assert cfg.vocab_size == len(tr.tok)


def test_rollout_eval_skips_rows_without_a_reference():
    from dart_jax.rollout.protocol import QA, SQL
    from dart_jax.run.held_out import rollout_eval
    assert rollout_eval(None, None, QA, None, None, "dart_jax", None, None, [{"question": "q"}]) == {}
    assert rollout_eval(None, None, SQL, None, None, "dart_jax", None, None, [{"question": "q", "db_path": "x"}]) == {}
