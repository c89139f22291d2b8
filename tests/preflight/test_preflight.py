"""Preflight (dart_jax/run/checks.py, dart_jax/preflight/, launch.preflight, the hook in launch.train): each check fails
on the real thing missing and names the fix; the memory estimate is XLA's memory analysis of the step
the trainer compiles, checked against a direct compile on real arrays as bench/sweep does it."""

import os
import socket
import time

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import dart_jax.preflight as pfl
from configs import base
from dart_jax.preflight import memory as mem
from dart_jax.run import checks as pf
from dart_jax.run.spec import run_spec

SPIDER = dict(reader="spider", path="data/spider/dev_questions.jsonl", db_root="data/spider/database",
              data_source="spider_dev")


def dead_url() -> str:
    """A loopback port nothing listens on (bound, then released)."""
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
    s.close()
    return f"http://127.0.0.1:{port}/retrieve"


def qa_config(**train):
    c = base.get()
    c.data.train = [dict(reader="flashrag", path="data/qa/nq_oracle.jsonl", data_source="nq")]
    c.model.path = "smollm2-135m-instruct"
    c.train.update(dict(prompts_per_step=2, group_size=2, mini_batch=4, micro_batch=2, **train))
    return c


def test_dead_retriever_fails_fast_in_one_line():
    c = qa_config()
    c.retriever.url = dead_url()
    t0 = time.perf_counter()
    check = pf.check_retriever(run_spec(c))
    assert time.perf_counter() - t0 < 5
    assert check.failed and "\n" not in check.line()
    assert c.retriever.url in check.message and "launch.serve_retriever" in check.message


def test_live_server_over_the_shipped_index_passes(tmp_path, monkeypatch):
    monkeypatch.setenv("DART_JAX_CACHE", str(tmp_path))
    from dart_jax.tools.retrieval import Retriever, ensure_index
    from dart_jax.tools.retrieval_server import RetrievalServer
    retriever = Retriever(ensure_index())
    server = RetrievalServer(retriever, "127.0.0.1", 0).start()
    try:
        c = qa_config()
        c.retriever.url, c.retriever.topk = server.url, 3
        check = pf.check_retriever(run_spec(c))
    finally:
        server.stop()
    assert check.status == "ok", check.line()
    assert check.data["passages"] == 3 and check.data["url"] == server.url


def test_index_dir_without_its_files_fails(tmp_path):
    c = qa_config()
    c.retriever.index_dir = str(tmp_path)
    check = pf.check_retriever(run_spec(c))
    assert check.failed and "meta.json" in check.message and "launch.build_index" in check.message


def test_missing_dataset_names_prepare_data():
    c = qa_config()
    c.data.train = [dict(reader="search_r1_parquet", path="data/nq_hotpotqa_train/no_such.parquet")]
    check = pf.check_datasets(run_spec(c))
    assert check.failed and "data.train[0].path" in check.message
    assert "python -m launch.prepare_data qa" in check.message


def test_database_roots(tmp_path):
    root = os.path.join(pf.REPO, SPIDER["db_root"])
    shipped = sorted(d for d in os.listdir(root) if os.path.isfile(os.path.join(root, d, f"{d}.sqlite")))
    c = qa_config()
    c.task = "sql"
    c.data.train = [SPIDER]  # Spider dev names databases the repository does not ship
    partial = pf.check_databases(run_spec(c))
    assert partial.failed and "data.train[0].db_root" in partial.message and partial.data["missing"] >= 1
    c.data.train = [dict(SPIDER, db_ids=shipped)]  # only the rows of shipped databases
    good = pf.check_databases(run_spec(c))
    assert good.status == "ok", good.line()
    assert good.data["checked"] == min(len(shipped), pf.DB_SAMPLE)
    c.data.train = [dict(SPIDER, db_ids=shipped, db_root=str(tmp_path / "absent"))]
    absent = pf.check_databases(run_spec(c))
    assert absent.failed and "db_root" in absent.message and "not a directory" in absent.message
    c.data.train = [dict(SPIDER, db_ids=shipped, db_root=str(tmp_path))]  # a folder without the databases
    empty = pf.check_databases(run_spec(c))
    assert empty.failed and empty.data["missing"] == empty.data["checked"] == min(len(shipped), pf.DB_SAMPLE)


def test_prepared_sql_rows_carry_their_databases(tmp_path):
    """A file written by launch.prepare_data sql names each row's database, so configs/paper_sql.py's
    empty db_root passes; a database removed after preparing is found missing."""
    from dart_jax.data import prepare
    from dart_jax.eval.datasets import exclusion_specs
    from standins.datasets import sample_skyrl_sql
    src, root = sample_skyrl_sql(str(tmp_path / "in.parquet"), str(tmp_path / "omnisql"))
    out = str(tmp_path / "prepared")
    prepare.prepare("sql", src, exclusion_specs("sql"), out, db_root=root)
    c = qa_config()
    c.task = "sql"
    c.data.train = [dict(reader="skyrl_sql", path=os.path.join(out, "train.parquet"), db_root="",
                         data_source="skyrl_sql")]
    good = pf.check_databases(run_spec(c))
    assert good.status == "ok" and good.data["checked"] == 3, good.line()  # concert_singer, pets_1, synsql_shop
    os.remove(os.path.join(root, "spider", "database", "pets_1", "pets_1.sqlite"))
    gone = pf.check_databases(run_spec(c))
    assert gone.failed and gone.data["missing"] == 1 and "pets_1" in gone.message, gone.line()


def test_missing_weights_name_the_download_command():
    c = qa_config()
    c.model.path = "dart-jax-tests/no-such-model"
    check = pf.check_weights(run_spec(c))
    assert check.failed and "hf download dart-jax-tests/no-such-model" in check.message
    c.model.path = "smollm2-135m-instruct"
    c.warm_start = "data/warm_start/no_such_dir"
    check = pf.check_weights(run_spec(c))
    assert check.failed and "warm_start" in check.message and "launch.sft" in check.message


def test_mesh_larger_than_the_devices():
    c = qa_config()
    c.mesh.shape = (jax.device_count() * 2, 1, 1)
    check = pfl.check_mesh(c, 1)
    assert check.failed and "mesh.shape" in check.message and f"{jax.device_count()} available" in check.message
    c.mesh.shape = (2, 1, 1)
    c.train.prompts_per_step = 3  # 3 × 2 trajectories do not split into mini-batches of 4
    check = pfl.check_mesh(c, 1)
    assert check.failed and "train.mini_batch" in check.message


def tiny_config(path: str):
    c = qa_config()
    c.model.update(path=path, param_dtype="float32", compute_dtype="float32", remat_policy="none")
    c.mesh.shape = (2, 1, 1)
    c.rollout.update(max_response_tokens=48, max_tokens_per_turn=16, decode_layout="per_layer")
    c.train.pad_multiple = 16
    return c


def test_memory_estimate_is_the_compiled_steps_analysis(tiny_dirs):
    """The estimate of the update equals XLA's memory analysis of the same step compiled on real,
    placed arrays (bench/sweep's way), and the train state equals the live arrays' shards."""
    from dart_jax.adapters.method import init_adapters
    from dart_jax.bench.train import synthetic_batch
    from dart_jax.checkpoints.registry import load_model
    from dart_jax.parallel.mesh import make_mesh
    from dart_jax.rl.optim import make_optimizer
    from dart_jax.rl.placement import jit_step, microbatch_sharding, place_state, state_bytes_per_device
    from dart_jax.rl.step import BATCH_KEYS, make_train_step

    c = tiny_config(tiny_dirs["qwen2"][0])
    mesh = make_mesh((2, 1, 1), jax.devices()[:2])
    cfg, arch = pf.architecture(run_spec(c))
    assert arch == c.model.path
    seq = mem.lengths(run_spec(c), 32)["train_length"]
    got = mem.train_memory(run_spec(c), cfg, mesh, "per_layer", seq)

    spec = run_spec(c)
    method, lc, oc = spec.method, spec.loss, spec.optim
    cfg2, base_params = load_model(c.model.path, mesh=mesh, **spec.model.overrides())
    state, placed = place_state(method, cfg2, base_params, init_adapters(method, cfg2, jax.random.PRNGKey(0)),
                                make_optimizer(oc), mesh)
    m, b = c.train.mini_batch // c.train.micro_batch, c.train.micro_batch
    data = synthetic_batch(cfg2, m * b, seq)
    batch = {k: jnp.asarray(data[k]).reshape((m, b) + data[k].shape[1:]) for k in BATCH_KEYS}
    batch = {k: jax.device_put(v, microbatch_sharding(v.shape, mesh)) for k, v in batch.items()}
    fn = jit_step(make_train_step(cfg2, method, lc, oc), state, placed, {k: v.shape for k, v in batch.items()}, mesh)
    ma = fn.lower(state, placed, batch, jax.random.PRNGKey(0), np.int32(0)).compile().memory_analysis()
    assert got["step"] == (ma.argument_size_in_bytes + ma.output_size_in_bytes + ma.temp_size_in_bytes
                           - ma.alias_size_in_bytes)
    assert got["step_temp"] == ma.temp_size_in_bytes
    assert got["state"] == state_bytes_per_device(state)
    shard = sum(max(s.data.nbytes for s in x.addressable_shards) for x in jax.tree.leaves(placed))
    assert got["base"] == shard


def test_memory_over_budget_names_a_setting_that_fits(tiny_dirs):
    c = tiny_config(tiny_dirs["qwen2"][0])
    model = mem.MemoryModel(run_spec(c), pf.architecture(run_spec(c))[0], 1, 32)
    current = mem.Setting((2, 1, 1), "per_layer", "none")
    here = model.estimate(current)
    assert here["layout_copy"] > 0  # per_layer keeps a copy of the layers through the update
    stacked = model.estimate(mem.Setting((2, 1, 1), "stacked", "none"))
    assert stacked["peak"] < here["peak"]
    budget_gib = (stacked["peak"] + here["peak"]) / 2 / pf.GIB
    over = mem.check_memory(run_spec(c), 1, budget_gib, prompt_tokens=32)
    assert over.failed and "\n" not in over.message
    assert "rollout.decode_layout=stacked" in over.message
    assert over.data["fits"]["gib"] <= budget_gib < over.data["estimate_gib"]["peak"]
    # the named setting, applied to the config, passes at the same budget
    c.rollout.decode_layout = over.data["fits"]["setting"]["layout"]
    c.model.remat_policy = over.data["fits"]["setting"]["remat"]
    c.mesh.shape = over.data["fits"]["setting"]["mesh"]
    assert over.data["fits"]["setting"]["chunk_rows"] == 0  # the rollout's KV cache was not what did not fit
    assert mem.check_memory(run_spec(c), 1, budget_gib, prompt_tokens=32).status == "ok"


def test_kv_cache_over_budget_names_the_largest_chunk_that_fits(tiny_dirs):
    """64 trajectories per step (32 prompts × 2): no mesh, layout or remat on the config's 2 devices
    holds their KV cache under the budget, so only a rollout decoded in chunks fits; the check names
    the largest chunk_rows (whole groups) that does, and that setting passes."""
    c = tiny_config(tiny_dirs["qwen2"][0])
    c.train.prompts_per_step = 32
    cfg = pf.architecture(run_spec(c))[0]
    model = mem.MemoryModel(run_spec(c), cfg, 1, 256)
    lengths = mem.lengths(run_spec(c), 256)
    # the whole share's cache by hand: k and v of every layer, fp32, plus a position per slot, over 2 devices
    per_slot = 2 * cfg.num_layers * cfg.num_kv_heads * cfg.head_dim * 4 + 4
    share_kv = 64 * lengths["capacity"] * per_slot / 2
    lightest = model.estimate(mem.Setting((2, 1, 1), "stacked", "full", chunk_rows=2))["peak"]
    assert lightest < share_kv
    budget_gib = (lightest + share_kv) / 2 / pf.GIB
    over = mem.check_memory(run_spec(c), 1, budget_gib, prompt_tokens=256)
    assert over.failed and "\n" not in over.message and "processes" not in over.message
    fits = over.data["fits"]["setting"]
    assert f"--config.rollout.chunk_rows={fits['chunk_rows']}" in over.message
    assert fits["chunk_rows"] in (2, 4, 8, 16, 32)  # the share halved, whole groups of 2
    assert over.data["fits"]["gib"] <= budget_gib
    if fits["chunk_rows"] < 32:  # the largest that fits: twice as many rows does not
        twice = mem.Setting(tuple(fits["mesh"]), fits["layout"], fits["remat"], fits["chunk_rows"] * 2)
        assert model.estimate(twice)["peak"] > budget_gib * pf.GIB
    c.rollout.update(decode_layout=fits["layout"], chunk_rows=fits["chunk_rows"])
    c.model.remat_policy = fits["remat"]
    c.mesh.shape = fits["mesh"]
    passed = mem.check_memory(run_spec(c), 1, budget_gib, prompt_tokens=256)
    assert passed.status == "ok", passed.line()
    assert f"{fits['chunk_rows']} rows × {lengths['capacity']} slots, chunks of the share's 64 rows" in passed.message


def test_memory_is_skipped_on_cpu_without_a_budget():
    check = mem.check_memory(run_spec(qa_config()), 1, None)
    assert check.status == "skipped" and "host RAM" in check.message


def test_paper_presets_stand_in_for_absent_weights():
    from configs import paper_qa
    c = paper_qa.get_config("dart,qwen2.5-7b-base")
    cfg, arch = pf.architecture(run_spec(c))
    assert "data/model_configs/Qwen/Qwen2.5-7B/config.json" in arch and "not present" in arch
    # Qwen2.5-7B as published: 7.62B parameters (the model card's figure)
    assert (cfg.hidden_size, cfg.num_layers, cfg.num_kv_heads, cfg.vocab_size) == (3584, 28, 4, 152064)
    assert round(cfg.num_params() / 1e9, 2) == 7.62


def test_launch_train_stops_before_the_model_on_a_dead_retriever(tmp_path, capsys, monkeypatch):
    from dart_jax.rl.trainer import Trainer
    from launch import train
    out = tmp_path / "run"
    argv = ["--config=configs/quickstart.py", f"--config.retriever.url={dead_url()}",
            "--config.data.train[0].path=data/qa/no_such_file.jsonl", f"--config.output.dir={out}"]

    def never(*args, **kwargs):
        raise AssertionError("the trainer (and its model load) started despite a failed preflight")
    monkeypatch.setattr(Trainer, "__init__", never)
    with pytest.raises(SystemExit) as e:
        train.main(argv)
    assert e.value.code == 2
    monkeypatch.undo()
    err = capsys.readouterr().err
    assert "retriever  FAIL" in err and "datasets   FAIL" in err and not out.exists()
    # --skip-preflight: the trainer itself starts and meets the missing file (before its model load)
    try:
        train.main(argv + ["--skip-preflight"])
        raise AssertionError("launch.train ran without its training file")
    except FileNotFoundError as e:
        message = str(e)
    except SystemExit as e:  # the command's one-line report of the same error
        assert e.code == 2
        message = capsys.readouterr().err
    assert "no_such_file" in message and "preflight" not in message


def test_launch_preflight_exit_status(capsys, tmp_path):
    from launch import preflight
    assert preflight.main(["--config=configs/quickstart.py", f"--json={tmp_path / 'p.json'}"]) == 0
    assert "memory     skipped" in capsys.readouterr().out
    assert preflight.main(["--config=configs/quickstart.py", f"--config.retriever.url={dead_url()}"]) == 2
    out = capsys.readouterr().out
    assert "retriever  FAIL" in out and "preflight failed" in out
