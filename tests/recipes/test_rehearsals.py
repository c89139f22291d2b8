"""Dress rehearsals of docs/recipes/: each recipe's own commands, parsed from its markdown, run end to end
on CPU with tiny stand-ins for the downloads (tests/recipes/recipe_harness.py says how each step kind
is treated). What each rehearsal checks against an independent reference:

- prepare: the written train.parquet holds the stand-in's rows minus the one evaluation question
  among them (hand-counted from recipe_harness.QA_TRAIN / SQL_TRAIN);
- serve: the served top-3 for a probe query are the ids a direct faiss search of the stand-in
  e5_Flat.index returns for the query's embedding computed with torch as Search-R1's server does;
- train: the run directory the evaluate step names exists, with a metrics row per step and the
  model and retriever the recipe gave in its saved config;
- evaluate: results.json for every set evaluated, and each `--compare=METHOD,BACKBONE` printed as
  the paper's row (names from dart_jax/eval/paper.py).

The sbatch file and the TPU page's training command are checked against the recipes' own lines.
"""

from __future__ import annotations

import json
import os
import re
import shlex

import faiss
import jax
import pyarrow.parquet as pq
import pytest

import recipe_harness as rh

SBATCH = os.path.join(rh.REPO, "launch", "slurm", "train.sbatch")


@pytest.fixture(scope="module")
def standins(tmp_path_factory) -> rh.StandIns:
    return rh.StandIns(str(tmp_path_factory.mktemp("standins")))


@pytest.fixture(scope="module")
def xla_cache() -> str:
    """The suite's compilation cache (tests/conftest.py), shared with the rehearsals' processes."""
    return jax.config.jax_compilation_cache_dir


def _flag(args: list[str], name: str) -> str | None:
    """The last value of --name=VALUE in an argument list (absl: the last one wins)."""
    vals = [a.split("=", 1)[1] for a in args if a.startswith(f"--{name}=")]
    return vals[-1] if vals else None


def _check_prepare(reh: rh.Rehearsal, ran: rh.Ran) -> None:
    args = shlex.split(ran.command)
    task = args[args.index("launch.prepare_data") + 1]
    out = os.path.join(reh.root, _flag(args, "out"))
    rows = pq.read_table(os.path.join(out, "train.parquet")).to_pylist()
    if task == "qa":
        # the last stand-in row is a question of the shipped NQ evaluation slice: excluded
        assert [r["question"].rstrip("?") for r in rows] == [q.rstrip("?") for _, q, _ in rh.QA_TRAIN[:-1]]
    else:
        assert sorted(r["db_id"] for r in rows) == sorted(db for db, _, _, _ in rh.SQL_TRAIN)


def _check_served(standins: rh.StandIns, ran: rh.Ran) -> None:
    from standins.search_r1_index import search_r1_encode
    got = [[hit["document"]["id"] for hit in row] for row in json.loads(ran.stdout)["result"]]
    index = faiss.read_index(os.path.join(standins.cache, "search_r1", "e5_Flat.index"))
    q = search_r1_encode(os.path.join(standins.cache, "e5"), [rh.PROBE], "query: ")
    _, ids = index.search(q, 3)
    assert got == [[str(i) for i in ids[0]]]


def _run_dir(args: list[str]) -> str:
    """The run directory a training command writes (its --config.output.dir, else the paper config's)."""
    method, _, model = _flag(args, "config").split(":", 1)[1].partition(",")
    return _flag(args, "config.output.dir") or (f"runs/{method}-{model}" if model else
                                                  f"runs/sql-{method}-qwen2.5-coder-7b")


def _check_train(reh: rh.Rehearsal, ran: rh.Ran) -> str:
    args = shlex.split(ran.command[rh.LAUNCH.search(ran.command).start():])
    run = _run_dir(args)
    rows = [json.loads(line) for line in open(os.path.join(reh.root, run, "metrics.jsonl"))]
    assert [r["step"] for r in rows if r["step"] > 0] == [1]
    saved = json.load(open(os.path.join(reh.root, run, "run_config.json")))
    assert saved["model"]["path"] == _flag(args, "config.model.path")
    url = _flag(args, "config.retriever.url")
    if url:  # the rehearsal's port, after the recipe's was substituted
        assert saved["retriever"]["url"] == os.path.expandvars(url).replace("$RETRIEVER_IP", "127.0.0.1")
    return run


def _check_evaluate(reh: rh.Rehearsal, ran: rh.Ran) -> None:
    from dart_jax.eval.paper import METHOD_NAMES
    args = shlex.split(ran.command[rh.LAUNCH.search(ran.command).start():])
    res = json.load(open(os.path.join(reh.root, _flag(args, "out"), "results.json")))
    assert res["datasets"] and all(d["questions"] <= 2 for d in res["datasets"].values())
    # evaluated as trained: the run's base model and retriever, with no --model / --config given
    saved = json.load(open(os.path.join(reh.root, _flag(args, "checkpoint"), "run_config.json")))
    assert res["setup"]["model"] == saved["model"]["path"], (res["setup"]["model"], saved["model"]["path"])
    if saved["task"] == "qa":
        assert res["setup"]["retriever"]["url"] == saved["retriever"]["url"] != ""
    for pair in [a.split("=", 1)[1] for a in args if a.startswith("--compare=")]:
        method, backbone = pair.split(",")
        assert f"paper: {METHOD_NAMES[method]} ({backbone})" in ran.stdout, ran.stdout[-3000:]


# Rehearsed in CI's default run: the QA 3B page (prepare, adopt + serve, preflight on 8 devices, DART,
# Search-R1 and LoRA-16 with the stacked and per-layer decode layouts, the sbatch step, as-trained
# evaluation), the paper's main setting. The other pages run the same entry points with other configs
# and are rehearsed under -m slow (CI time: 7B/8B ~4 min, SQL 154 s, TPU 86 s on 2 cores, alone):
#     python tests/run_suite.py -m slow --only recipes
# In the default run their blocks parse (the TPU and sbatch commands are checked against the 3B page's),
# tests/test_configs.py builds every paper_qa and paper_sql config, the SQL path's pieces run in
# tests/data (prepare_data sql), tests/sft/test_sql_quickstart.py (SQL GRPO) and tests/eval (Spider
# databases), and training and evaluation on 8 devices in tests/parallel/test_multihost.py (one
# process x 8 devices, two x 4).
SLOW_REHEARSALS = {"qa-7b-8b.md", "sql-qwen2.5-coder-7b.md", "tpu-pod.md"}


@pytest.mark.parametrize("recipe", [pytest.param(os.path.basename(p), marks=pytest.mark.slow)
                                    if os.path.basename(p) in SLOW_REHEARSALS else os.path.basename(p)
                                    for p in rh.recipes()])
def test_rehearsal(recipe, standins, xla_cache, tmp_path):
    reh = rh.Rehearsal(os.path.join(rh.RECIPES, recipe), str(tmp_path), standins, xla_cache)
    ran = reh.run()
    print(reh.table())
    trained = set()
    for r in ran:
        if r.note.startswith("not run") or r.step.kind in ("env", "download"):
            continue
        if r.step.kind == "prepare":
            _check_prepare(reh, r)
        elif r.step.kind == "serve":
            _check_served(standins, r)
        elif r.step.kind == "train":
            trained.add(_check_train(reh, r))
        elif r.step.kind == "evaluate":
            _check_evaluate(reh, r)
    evaluated = {_flag(c, "checkpoint") for c in rh.launch_commands(reh.steps, ("evaluate",))}
    assert evaluated == trained, "every run the recipe trains is the one it evaluates"


def test_every_page_parses_into_the_steps_it_rehearses():
    """The default run's check of the pages rehearsed only under -m slow: every page's blocks parse
    (each marked with a known step kind), and each page trains and evaluates the same runs."""
    for p in rh.recipes():
        steps = rh.parse(p)
        kinds = {s.kind for s in steps}
        assert {"train", "evaluate"} <= kinds, (p, kinds)
        trained = {_run_dir(c) for c in rh.launch_commands(steps, ("train",))}
        evaluated = {_flag(c, "checkpoint") for c in rh.launch_commands(steps, ("evaluate",))}
        assert trained and evaluated == trained, (p, trained, evaluated)


def test_every_recipe_is_indexed():
    """docs/recipes/README.md links every recipe page, and every page it links exists."""
    index = open(os.path.join(rh.RECIPES, "README.md")).read()
    linked = set(re.findall(r"\]\(([\w.-]+\.md)\)", index))
    assert linked == {os.path.basename(p) for p in rh.recipes()}


# flags the sbatch adds for a multi-node job: jax's cluster detection, the preflight it runs itself before
# training, one output directory per job
SBATCH_ONLY = {"--distributed", "--skip-preflight", "--config.output.dir"}


def _effective(args: list[str]) -> dict[str, str]:
    """flag -> value as absl reads an argument list (the last of repeated flags wins; bare flags ''), mesh
    shapes normalised ('(16, 1, 1)' == '(16,1,1)')."""
    out = {}
    for a in args:
        if a.startswith("--"):
            key, _, val = a.partition("=")
            out[key] = val.replace(" ", "") if key == "--config.mesh.shape" else val
    return out


def _sbatch_starts(args: list[str], nodes: int, gpus: int) -> list[list[str]]:
    """The commands launch/slurm/train.sbatch hands to `srun` for these arguments on `nodes` nodes of `gpus`
    GPUs: the script itself, run by bash with `srun` a function printing its arguments (no SLURM here)."""
    import subprocess
    env = dict(os.environ, SLURM_JOB_NUM_NODES=str(nodes), SLURM_GPUS_ON_NODE=str(gpus), SLURM_JOB_NAME="dart-grpo",
               SLURM_JOB_ID="7")
    p = subprocess.run(["bash", "-c", 'srun() { printf "%q " "$@"; echo; }; source "$0" "$@"', SBATCH, *args],
                       cwd=rh.REPO, env=env, capture_output=True, text=True, check=True)
    return [shlex.split(line) for line in p.stdout.splitlines() if line.strip()]


def test_sbatch_matches_recipe():
    """The QA 3B recipe's two-node step, run through launch/slurm/train.sbatch's own command construction
    on 2 nodes × 8 GPUs, starts launch.preflight and launch.train with exactly the recipe's arguments,
    the 2 × 8 mesh of the recipe's table and only the multi-node flags besides; the config and model are
    the rehearsed single-node DART command's, and the retriever line is the rehearsed serve command
    exposed beyond loopback."""
    steps = rh.parse(os.path.join(rh.RECIPES, "qa-qwen2.5-3b.md"))
    block = next(s for s in steps if s.kind == "sbatch")
    submit = shlex.split(next(c for c in block.commands if c.startswith("sbatch ")))
    assert submit[1] == "launch/slurm/train.sbatch"
    given = _effective(submit[3:])
    started = {c[2]: c for c in _sbatch_starts(submit[2:], nodes=2, gpus=8)}
    assert set(started) == {"launch.preflight", "launch.train"}
    for module in started:
        got = {k: v for k, v in _effective(started[module][3:]).items() if k not in SBATCH_ONLY}
        want = dict(given, **{"--config": submit[2], "--config.mesh.shape": "(16,1,1)"})  # table: 2 × 8, DART
        if module == "launch.preflight":  # the sbatch hands it the --config.* arguments only
            want = {k: v for k, v in want.items() if k.startswith("--config")}
        assert got == want, f"{SBATCH} starts {module} with {got}; the recipe gives {want}"
    single = next(c for c in rh.launch_commands(steps, ("train",)) if f"--config={submit[2]}" in c)
    assert _flag(single, "config.model.path") == given["--config.model.path"]
    served = rh.launch_commands([s for s in steps if s.kind == "serve"])[0]
    exposed = rh.launch_commands([block])[0]
    assert exposed[:exposed.index(">")] == served + ["--host=0.0.0.0"]


def test_tpu_training_command_is_the_rehearsed_one():
    """The TPU page's training command (run on every worker) is the 3B recipe's DART command plus
    --distributed: the pod runs the setting the GPU recipe rehearses."""
    tpu = rh.launch_commands(rh.parse(os.path.join(rh.RECIPES, "tpu-pod.md")), ("train",))
    gpu = rh.launch_commands(rh.parse(os.path.join(rh.RECIPES, "qa-qwen2.5-3b.md")), ("train",))
    assert len(tpu) == 1 and "--distributed" in tpu[0]
    strip = [a for a in tpu[0] if a != "--distributed" and not a.startswith("--config.retriever.url=")]
    assert any(strip == [a for a in g if not a.startswith("--config.retriever.url=")] for g in gpu)


def test_harness_refuses_an_unmarked_block(tmp_path):
    page = tmp_path / "bad.md"
    page.write_text("# x\n\n```bash\npython -m launch.train --config=configs/quickstart.py\n```\n")
    with pytest.raises(ValueError, match="without a `<!-- step: KIND -->` marker"):
        rh.parse(str(page))


def test_no_placeholder_left():
    """The memory tables carry the preflight's figures, not placeholders."""
    for p in rh.recipes():
        assert "PLACEHOLDER" not in open(p).read(), p


def test_standin_index_parts_concatenate_to_the_index(standins, tmp_path):
    """`cat part_*` of the stand-in wiki-18-e5-index is byte for byte the index it was cut from, as
    for Search-R1's published parts."""
    standins.place("PeterJinGo/wiki-18-e5-index", str(tmp_path / "hf"), str(tmp_path / "idx"), [])
    parts = sorted(os.listdir(tmp_path / "idx"))
    assert parts == ["part_aa", "part_ab"]
    joined = b"".join(open(tmp_path / "idx" / p, "rb").read() for p in parts)
    assert joined == open(os.path.join(standins.cache, "search_r1", "e5_Flat.index"), "rb").read()
    assert faiss.read_index(os.path.join(standins.cache, "search_r1", "e5_Flat.index")).ntotal == rh.StandIns.PASSAGES
