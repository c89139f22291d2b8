"""Dress rehearsals of docs/recipes/: a recipe's own command blocks, parsed from its markdown and run
in order on CPU, with every external artifact replaced by a tiny stand-in in the published format.

Why parse the markdown instead of keeping a copy of the commands here: a recipe whose commands stop
working fails CI, and a command that is edited in the page is the command that is rehearsed. Each
```bash block of a recipe is preceded by a marker naming its kind,

    <!-- step: KIND -->

and a block without one is an error (nothing in a recipe escapes the rehearsal silently). What the
harness does with each kind:

    env          `export NAME=value` lines: run before every later step (HOME is a scratch directory,
                 so `$HOME/...` lands there); `<!-- step: env standin=VALUE -->` gives each name VALUE
                 instead (a value only a cloud account can look up, e.g. a worker's address)
    install      `pip install -r FILE`: FILE must exist; not run (no package index in tests; resolving
                 the files is tests/test_requirements.py's job); `pip uninstall` is not run either
    download     `hf download REPO ...` lines are replaced by the stand-in builder of REPO (StandIns),
                 which writes the files REPO publishes, in its layout, where `hf download` would put
                 them (the Hugging Face cache, or --local-dir); `hf auth login` is not run (no
                 account); every other line (cat, rm, gzip -d, python -m zipfile -e) runs as written
    prepare, index
                 run as written
    serve        run as written in the background, on a free port instead of the recipe's (later
                 commands get the same substitution); ready when GET /health answers; stopped when
                 the rehearsal ends
    preflight, train, evaluate
                 run as written with scale overrides appended (SCALE: one step of 2 prompts × 2
                 samples, 8-token turns, 2 questions per evaluation set);
                 flags given twice take the last value, so the recipe's own flags stay as written
                 before them
    sbatch       `sbatch launch/slurm/train.sbatch ...` (and the retriever line before it): not run here
                 (no SLURM); tests/recipes/test_rehearsals.py runs the sbatch file's own command
                 construction on this step's arguments and checks what it would start against the
                 recipe's rehearsed commands
    cloud        creates, copies to or deletes cloud resources (`gcloud ... create`): not run
    alternative  another project's command (e.g. Search-R1's own retrieval server): not run, said so

Devices: preflight steps run on 8 forced CPU devices (DEVICES), so the recipe's mesh flags are checked
against the 8 accelerators they are written for; training and evaluation run on 8 too, unless the page
says `<!-- rehearsal: devices=1 -->` (the GPU pages: 8 forced devices double a tiny run's cost, and the
TPU page, rehearsed under -m slow, runs an 8-device mesh), in which case they run on one device, training with
`--config.mesh.shape=(1,1,1)` in place of the recipe's mesh (a tuple flag cannot be given twice).
Everything else runs on one device.

A command of any kind may be `gcloud ... ssh ... --command="A && B && ..."` (a TPU pod's workers): its
parts are rehearsed as if on one host, each as its step's kind says, with the worker's set-up
dropped (`cd DIR`, `source .venv/bin/activate`, `sudo ...`, `python3.X -m venv ...`: the rehearsal
uses the test's interpreter) and `--distributed` dropped (one process on the forced CPU devices
stands in for the pod's hosts).

Every launch.* command runs through bash from a scratch root whose entries link to this repository
(its data/ is a fresh directory of links, runs/ is empty), so relative paths in the recipe
(`data/nq_hotpotqa_train`, `runs/...`) resolve as they do in a checkout without writing into it.
"""

from __future__ import annotations

import dataclasses
import gzip
import json
import os
import re
import shlex
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
import urllib.request
import zipfile
from collections.abc import Callable

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
RECIPES = os.path.join(REPO, "docs", "recipes")
sys.path.insert(0, os.path.join(REPO, "tests"))
from xla_env import xla_flags  # noqa: E402

KINDS = ("env", "install", "download", "prepare", "index", "serve", "preflight", "train", "evaluate", "sbatch",
         "cloud", "alternative")
NOT_RUN = {
    "install": "pip install needs the package index; tests/test_requirements.py resolves these files",
    "sbatch": "no SLURM here; test_sbatch_matches_recipe runs the sbatch file's command construction against it",
    "alternative": "another project's command, not part of this checkout",
    "cloud": "creates, copies to or deletes cloud resources",
    "uninstall": "changes the installed packages",
    "login": "needs a Hugging Face account",
    "worker": "a worker's system set-up; the rehearsal uses the test's interpreter",
}
WORKER_SETUP = re.compile(r"^(cd\s+\S+|source\s+\S*bin/activate)$")
SYSTEM_SETUP = re.compile(r"^(sudo\s|python3(\.\d+)?\s+-m\s+venv\s)")
PROBE = "who sang a little less conversation"  # the query sent to a served index, answer kept for the test
DEVICES = 8  # forced CPU devices: the recipes' meshes are written for 8 accelerators
# appended to the recipe's command (absl: a flag given twice takes the last value)
SCALE = {
    "train": ["--config.train.steps=1", "--config.train.prompts_per_step=2", "--config.train.group_size=2",
              "--config.train.mini_batch=4", "--config.train.micro_batch=2", "--config.rollout.max_turns=1",
              "--config.rollout.max_tokens_per_turn=8", "--config.output.progress=False"],
    "evaluate": ["--limit=2", "--quiet"],
}
SCALE["preflight"] = SCALE["train"]
PAGE = re.compile(r"^<!--\s*rehearsal:((?:\s+[\w-]+=\S+)+)\s*-->\s*$")
MARKER = re.compile(r"^<!--\s*step:\s*(\w+)((?:\s+[\w-]+=\S+)*)\s*-->\s*$")
LAUNCH = re.compile(r"\bpython -m (launch\.\w+)")


@dataclasses.dataclass
class Step:
    """One command block of a recipe: its kind, the marker's options, its logical command lines."""

    kind: str
    options: dict[str, str]
    commands: list[str]
    line: int  # 1-based line of the marker in the markdown


def logical_lines(block: list[str]) -> list[str]:
    """Shell lines with backslash continuations joined; blank and comment lines dropped."""
    out, cur = [], ""
    for raw in block:
        s = raw.rstrip()
        if s.endswith("\\"):
            cur += s[:-1].strip() + " "
            continue
        cur += s.strip()
        if cur and not cur.startswith("#"):
            out.append(cur)
        cur = ""
    if cur.strip():
        out.append(cur.strip())
    return out


def parse(path: str) -> list[Step]:
    """The recipe's ```bash blocks, each with the kind its marker names; raises on an unmarked block, a
    marker not followed by a bash block, an unknown kind, or a launch.* line with a trailing comment
    (scale overrides are appended to the line)."""
    lines = open(path, encoding="utf-8").read().splitlines()
    steps, pending, i = [], None, 0
    where = os.path.relpath(path, REPO)
    while i < len(lines):
        line = lines[i]
        m = MARKER.match(line.strip())
        if m:
            kind = m.group(1)
            if kind not in KINDS:
                raise ValueError(f"{where}:{i + 1}: unknown step kind {kind!r}; expected one of {KINDS}")
            opts = dict(kv.split("=", 1) for kv in m.group(2).split())
            pending = (kind, opts, i + 1)
        elif line.startswith("```"):
            info = line[3:].strip()
            end = next((j for j in range(i + 1, len(lines)) if lines[j].startswith("```")), None)
            if end is None:
                raise ValueError(f"{where}:{i + 1}: code block never closed")
            if info == "bash":
                if pending is None:
                    raise ValueError(f"{where}:{i + 1}: a bash block without a `<!-- step: KIND -->` marker "
                                     f"before it; every command of a recipe is rehearsed")
                cmds = logical_lines(lines[i + 1:end])
                for c in cmds:
                    if LAUNCH.search(c) and " #" in c:
                        raise ValueError(f"{where}:{i + 1}: no comment after a launch.* command (the rehearsal "
                                         f"appends flags to it): {c}")
                steps.append(Step(pending[0], pending[1], cmds, pending[2]))
            elif pending is not None:
                raise ValueError(f"{where}:{pending[2]}: the step marker is followed by a ```{info} block; "
                                 "steps are ```bash blocks")
            pending, i = None, end
        elif pending is not None and line.strip():
            raise ValueError(f"{where}:{pending[2]}: a step marker must be followed by its ```bash block")
        i += 1
    return steps


def page_options(path: str) -> dict[str, str]:
    """The page's `<!-- rehearsal: key=value ... -->` line, if any."""
    for line in open(path, encoding="utf-8"):
        m = PAGE.match(line.strip())
        if m:
            return dict(kv.split("=", 1) for kv in m.group(1).split())
    return {}


def recipes() -> list[str]:
    """The recipe pages (every .md under docs/recipes/ except the index)."""
    return sorted(os.path.join(RECIPES, f) for f in os.listdir(RECIPES) if f.endswith(".md") and f != "README.md")


def parts(cmd: str) -> list[str]:
    """What one recipe line runs where the work happens: the line itself, or, for `gcloud ... ssh ...
    --command="A && B"`, its parts A, B (worker set-up such as `cd DIR` dropped)."""
    if not (cmd.startswith("gcloud ") and " ssh " in cmd):
        return [cmd]
    inner = next((a.split("=", 1)[1] for a in shlex.split(cmd) if a.startswith("--command=")), None)
    if inner is None:
        raise ValueError(f'a gcloud ssh line without --command="...": {cmd}')
    return [p.strip() for p in inner.split("&&") if not WORKER_SETUP.match(p.strip())]


def launch_commands(steps: list[Step], kinds: tuple[str, ...] | None = None) -> list[list[str]]:
    """The `python -m launch.X ...` commands of these steps as argument lists, from `python` on (an
    environment prefix such as `JAX_PLATFORMS=cpu` dropped, gcloud ssh lines unwrapped)."""
    out = []
    for s in steps:
        if kinds and s.kind not in kinds:
            continue
        for c in s.commands:
            for part in parts(c):
                m = LAUNCH.search(part)
                if m:
                    out.append(shlex.split(part[m.start():]))
    return out


# ---------------------------------------------------------------------------------------------------
# stand-ins: what each `hf download REPO` publishes, written tiny and in the same format


# Search-R1's train.parquet stand-in: (data_source, question, answers); the last row is an NQ test
# question of the shipped evaluation slice, which launch.prepare_data must exclude
QA_TRAIN = (
    ("nq", "who sang the song a little less conversation", ["Elvis Presley"]),
    ("nq", "when was the first episode of doctor who aired", ["23 November 1963"]),
    ("nq", "what is the capital city of australia", ["Canberra"]),
    ("hotpotqa", "Which magazine was started first, Arthur's Magazine or First for Women?", ["Arthur's Magazine"]),
    ("hotpotqa", "Which river flows through the city where the Eiffel Tower stands?", ["Seine"]),
    ("hotpotqa", "What nationality was the director of the film Jaws?", ["American"]),
    ("nq", "who told the story of the prodigal son", ["Jesus Christ"]),
)
# SkyRL-SQL-653's stand-in: (db_id, data, question, gold SQL) on the stand-in OmniSQL databases
SQL_TRAIN = (
    ("concert_singer", "spider", "List the names of all stadiums.", "SELECT name FROM stadium"),
    ("concert_singer", "spider", "Which singers are older than 40?", "SELECT name FROM singer WHERE age > 40"),
    ("pets_1", "spider", "How many students have a pet?", "SELECT count(DISTINCT stuid) FROM has_pet"),
    ("synsql_shop", "synsql", "Which product costs the most?",
     "SELECT name FROM products ORDER BY price DESC LIMIT 1"),
)
# BIRD dev's and mini-dev's first databases, cut to the tables and columns their first questions read
# (data/bird/dev.jsonl, data/bird/mini_dev.jsonl): db_id -> [(DDL, rows)]
BIRD_DBS = {
    "california_schools": [(
        "CREATE TABLE frpm (`County Name` TEXT, `Educational Option Type` TEXT, `Free Meal Count (K-12)` REAL, "
        "`Enrollment (K-12)` REAL, `Free Meal Count (Ages 5-17)` REAL, `Enrollment (Ages 5-17)` REAL)",
        [("Alameda", "Traditional", 500.0, 1000.0, 400.0, 900.0),
         ("Alameda", "Continuation School", 80.0, 100.0, 70.0, 90.0),
         ("Fresno", "Continuation School", 30.0, 120.0, 25.0, 110.0)])],
    "debit_card_specializing": [
        ("CREATE TABLE customers (CustomerID INTEGER, Segment TEXT, Currency TEXT)",
         [(1, "LAM", "EUR"), (2, "SME", "CZK"), (3, "LAM", "CZK")]),
        ("CREATE TABLE yearmonth (CustomerID INTEGER, Date TEXT, Consumption REAL)",
         [(1, "201201", 10.0), (3, "201202", 5.0), (2, "201301", 7.0)])],
}


def omnisql_data(root: str) -> str:
    """OmniSQL's data/ folder (tests/standins/datasets.py) plus BIRD dev's layout
    (bird/dev_20240627/dev_databases/<db>/<db>.sqlite) with BIRD_DBS. -> root."""
    import sqlite3

    from standins.datasets import omnisql_db_root
    omnisql_db_root(root)
    for db_id, tables in BIRD_DBS.items():
        folder = os.path.join(root, "bird", "dev_20240627", "dev_databases", db_id)
        os.makedirs(folder)
        con = sqlite3.connect(os.path.join(folder, f"{db_id}.sqlite"))
        for ddl, rows in tables:
            con.execute(ddl)
            table = ddl.split()[2]
            con.executemany(f"INSERT INTO {table} VALUES ({', '.join('?' * len(rows[0]))})", rows)
        con.commit()
        con.close()
    return root


def _split_in_parts(path: str, out_dir: str, parts: int = 2) -> None:
    """A file cut into `part_aa`, `part_ab`, … as `split` does (how Search-R1 publishes e5_Flat.index)."""
    data = open(path, "rb").read()
    size = -(-len(data) // parts)
    for k in range(parts):
        with open(os.path.join(out_dir, "part_a" + "abcdefghijklmnopqrstuvwxyz"[k]), "wb") as f:
            f.write(data[k * size:(k + 1) * size])


class StandIns:
    """Builds each stand-in once per session in `cache`, then puts it where `hf download` would."""

    MODELS = ("Qwen/Qwen2.5-3B", "Qwen/Qwen2.5-3B-Instruct", "Qwen/Qwen2.5-7B-Instruct",
              "meta-llama/Llama-3.1-8B-Instruct", "Qwen/Qwen2.5-Coder-7B-Instruct")
    ENCODER = "intfloat/e5-base-v2"
    PASSAGES = 48  # passages of the shipped corpus in the stand-in wiki-18

    def __init__(self, cache: str):
        self.cache = cache
        os.makedirs(cache, exist_ok=True)

    def _once(self, name: str, build: Callable[[str], None]) -> str:
        path = os.path.join(self.cache, name)
        if not os.path.exists(path):
            tmp = path + ".tmp"
            shutil.rmtree(tmp, ignore_errors=True)
            os.makedirs(tmp)
            build(tmp)
            os.rename(tmp, path)
        return path

    def _encoder_dir(self) -> str:
        """A tiny E5-shaped BERT (random weights, a real WordPiece vocabulary) as an HF directory."""
        from standins.search_r1_index import tiny_e5
        return self._once("e5", tiny_e5)

    def _search_r1(self) -> str:
        """e5_Flat.index + wiki-18.jsonl written as Search-R1 writes them, over the stand-in encoder."""
        from standins.search_r1_index import write_search_r1_index

        def build(d: str) -> None:
            rows = [json.loads(line) for line in open(os.path.join(REPO, "data", "corpus", "wiki_sample.jsonl"))]
            write_search_r1_index(d, self._encoder_dir(), [r["contents"] for r in rows[:self.PASSAGES]])
        return self._once("search_r1", build)

    def _model(self, hub: str, repo_id: str) -> str:
        """The tiny Qwen2 (tests/standins/hub.py) as `repo_id` in the hub cache `hub`: built once, its
        models--Org--Name folder copied (links included) under each name."""
        from huggingface_hub.file_download import repo_folder_name

        from standins.hub import tiny_qwen2_in_hub_cache
        built = self._once("hub", lambda d: tiny_qwen2_in_hub_cache(d, "stand-in/tiny-qwen2"))
        folder = repo_folder_name(repo_id=repo_id, repo_type="model")
        shutil.copytree(os.path.join(built, repo_folder_name(repo_id="stand-in/tiny-qwen2", repo_type="model")),
                        os.path.join(hub, folder), symlinks=True)
        commit = open(os.path.join(hub, folder, "refs", "main")).read().strip()
        return os.path.join(hub, folder, "snapshots", commit)

    def place(self, repo_id: str, hf_home: str, local_dir: str | None, files: list[str]) -> list[str]:
        """Write REPO's stand-in where `hf download REPO [FILES] [--local-dir DIR]` puts REPO's files;
        returns the paths written."""
        if repo_id in self.MODELS or repo_id == self.ENCODER:
            if local_dir:
                raise ValueError(f"hf download {repo_id} --local-dir: the recipes name models by hub id, found "
                                 "in the Hugging Face cache; download them without --local-dir")
            hub = os.path.join(hf_home, "hub")
            if repo_id == self.ENCODER:
                from standins.search_r1_index import into_hub_cache
                return [into_hub_cache(self._encoder_dir(), hub, repo_id)]
            return [self._model(hub, repo_id)]
        if not local_dir:
            raise ValueError(f"hf download {repo_id}: a dataset download in a recipe needs --local-dir")
        os.makedirs(local_dir, exist_ok=True)
        written = self._dataset(repo_id, local_dir)
        if files:  # `hf download REPO FILE ...` fetches only those
            missing = set(files) - {os.path.basename(p) for p in written}
            if missing:
                raise ValueError(f"hf download {repo_id} {' '.join(files)}: {sorted(missing)} not in what "
                                 f"{repo_id} publishes ({sorted(os.path.basename(p) for p in written)})")
            for p in written:
                if os.path.basename(p) not in files:
                    os.remove(p)
            written = [p for p in written if os.path.basename(p) in files]
        return written

    def _dataset(self, repo_id: str, out: str) -> list[str]:
        if repo_id == "PeterJinGo/wiki-18-e5-index":
            _split_in_parts(os.path.join(self._search_r1(), "e5_Flat.index"), out)
            return [os.path.join(out, "part_aa"), os.path.join(out, "part_ab")]
        if repo_id == "PeterJinGo/wiki-18-corpus":
            dst = os.path.join(out, "wiki-18.jsonl.gz")
            with open(os.path.join(self._search_r1(), "wiki-18.jsonl"), "rb") as src, gzip.open(dst, "wb") as f:
                shutil.copyfileobj(src, f)
            return [dst]
        if repo_id == "PeterJinGo/nq_hotpotqa_train":
            from standins.datasets import search_r1_row, write_search_r1_train
            train = [search_r1_row(src, i, q, a) for i, (src, q, a) in enumerate(QA_TRAIN)]
            test = [search_r1_row("nq", 0, "who wrote the declaration of independence", ["Thomas Jefferson"])]
            return [write_search_r1_train(os.path.join(out, "train.parquet"), train),
                    write_search_r1_train(os.path.join(out, "test.parquet"), test)]
        if repo_id == "NovaSky-AI/SkyRL-SQL-653-data-newfmt":
            from standins.datasets import skyrl_sql_row, write_skyrl_sql_653
            rows = [skyrl_sql_row(db, data, q, sql, index=i) for i, (db, data, q, sql) in enumerate(SQL_TRAIN)]
            return [write_skyrl_sql_653(os.path.join(out, "train.parquet"), rows),
                    write_skyrl_sql_653(os.path.join(out, "validation.parquet"), rows[:1])]
        if repo_id == "seeklhy/OmniSQL-datasets":
            root = self._once("omnisql", lambda d: omnisql_data(os.path.join(d, "data")))
            dst = os.path.join(out, "data.zip")
            with zipfile.ZipFile(dst, "w") as z:  # data.zip holds the data/ folder
                for folder, _, names in os.walk(root):
                    for n in names:
                        full = os.path.join(folder, n)
                        z.write(full, os.path.relpath(full, root))
            return [dst]
        raise ValueError(f"no stand-in for `hf download {repo_id}`: add one to StandIns in {__file__}")


def parse_hf_download(cmd: str) -> tuple[str, list[str], str | None]:
    """(repo id, files, --local-dir) of an `hf download` command line."""
    args = shlex.split(cmd)[2:]
    pos, local_dir, i = [], None, 0
    while i < len(args):
        a = args[i]
        if a.startswith("--"):
            key, eq, val = a.partition("=")
            if not eq and key not in ("--force-download", "--quiet"):
                val, i = args[i + 1], i + 1
            if key == "--local-dir":
                local_dir = val
        else:
            pos.append(a)
        i += 1
    return pos[0], pos[1:], local_dir


# ---------------------------------------------------------------------------------------------------
# the rehearsal


@dataclasses.dataclass
class Ran:
    """What one command of the rehearsal did."""

    step: Step
    command: str  # as run (after substitutions and appended overrides)
    seconds: float
    stdout: str = ""
    note: str = ""
    cpu_s: float = 0.0  # user + system time of the command's processes (wall time depends on the machine's load)


def _children_cpu() -> float:
    """User + system seconds of this process's finished children so far."""
    import resource
    ru = resource.getrusage(resource.RUSAGE_CHILDREN)
    return ru.ru_utime + ru.ru_stime


def _group_alive(pgid: int) -> bool:
    """Whether any process of the group is left (signal 0 checks without sending)."""
    try:
        os.killpg(pgid, 0)
        return True
    except ProcessLookupError:
        return False


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def shadow_root(dst: str) -> str:
    """A directory whose entries link to the repository's, with data/ a real directory of links and no
    runs/: the recipe's relative paths resolve as in a checkout, its outputs stay out of the checkout."""
    os.makedirs(os.path.join(dst, "data"))
    for name in os.listdir(REPO):
        if name in ("data", "runs", ".git") or name.startswith("."):
            continue
        os.symlink(os.path.join(REPO, name), os.path.join(dst, name))
    for name in os.listdir(os.path.join(REPO, "data")):
        os.symlink(os.path.join(REPO, "data", name), os.path.join(dst, "data", name))
    return dst


class Rehearsal:
    """Runs one recipe's steps in order (see the module docstring); `run()` returns what ran."""

    def __init__(self, recipe: str, work: str, standins: StandIns, xla_cache: str, timeout_s: float = 600):
        self.recipe, self.steps = recipe, parse(recipe)
        self.devices = int(page_options(recipe).get("devices", DEVICES))
        self.root = shadow_root(os.path.join(work, "root"))
        self.home = os.path.join(work, "home")
        self.hf_home = os.path.join(work, "hf")
        os.makedirs(self.home)
        self.standins, self.timeout_s = standins, timeout_s
        exe_dir = os.path.dirname(sys.executable)
        drop = ("HF_HUB_CACHE", "HUGGINGFACE_HUB_CACHE", "TRANSFORMERS_CACHE", "HF_HUB_OFFLINE", "XLA_FLAGS")
        self.env = {k: v for k, v in os.environ.items() if k not in drop}
        self.env.update(
            HOME=self.home, HF_HOME=self.hf_home, HF_HUB_OFFLINE="1", JAX_PLATFORMS="cpu",
            XLA_FLAGS=xla_flags(1), PATH=exe_dir + os.pathsep + os.environ.get("PATH", ""),
            PYTHONUNBUFFERED="1", TRANSFORMERS_VERBOSITY="error",
            # one compilation cache with the rest of the suite: the recipes' tiny programs compile once
            JAX_COMPILATION_CACHE_DIR=xla_cache, JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS="0",
            JAX_PERSISTENT_CACHE_MIN_ENTRY_SIZE_BYTES="0")
        self.prelude: list[str] = []  # the env steps' lines, run before every command
        self.ports: dict[str, str] = {}  # recipe port -> rehearsal port
        self.servers: list[tuple[subprocess.Popen, str]] = []
        self.ran: list[Ran] = []

    # -- helpers

    def _script(self, cmd: str) -> str:
        return "set -euo pipefail\n" + "\n".join(self.prelude + [cmd])

    def _expand(self, text: str) -> str:
        """`text` as bash expands it after the env steps (for the paths a stand-in is written to)."""
        out = subprocess.run(["bash", "-c", self._script(f"printf '%s' {text}")], cwd=self.root, env=self.env,
                             capture_output=True, text=True, check=True)
        return out.stdout

    def _substitute(self, cmd: str) -> str:
        """The recipe's retriever port -> the rehearsal's, in URLs (any host) and --port flags."""
        for theirs, ours in self.ports.items():
            cmd = re.sub(rf"(://[^/\s:'\"]+):{theirs}\b", rf"\g<1>:{ours}", cmd)
            cmd = re.sub(rf"--port[= ]{theirs}\b", f"--port={ours}", cmd)
        return cmd

    def _devices(self, step: Step) -> int:
        return DEVICES if step.kind == "preflight" else self.devices if step.kind in ("train", "evaluate") else 1

    def _bash(self, step: Step, cmd: str, note: str = "") -> Ran:
        t0, c0 = time.time(), _children_cpu()
        env = dict(self.env, XLA_FLAGS=xla_flags(self._devices(step)))
        p = subprocess.run(["bash", "-c", self._script(cmd)], cwd=self.root, env=env, capture_output=True,
                           text=True, timeout=self.timeout_s)
        ran = Ran(step, cmd, time.time() - t0, p.stdout, note, _children_cpu() - c0)
        self.ran.append(ran)
        if p.returncode != 0:
            raise AssertionError(f"{self.where(step)} exit {p.returncode}: {cmd}\n--- stdout\n{p.stdout[-3000:]}"
                                 f"\n--- stderr\n{p.stderr[-5000:]}")
        return ran

    # -- kinds

    def _install(self, step: Step, cmd: str) -> None:
        args = shlex.split(cmd)
        if args[:2] == ["pip", "uninstall"]:
            self.ran.append(Ran(step, cmd, 0.0, note="not run: " + NOT_RUN["uninstall"]))
            return
        files = [args[i + 1] for i, a in enumerate(args[:-1]) if a == "-r"]
        if args[:2] != ["pip", "install"] or not files:
            raise AssertionError(f"{self.where(step)}: an install step is `pip install -r FILE`: {cmd}")
        for f in files:
            assert os.path.isfile(os.path.join(REPO, f)), f"{self.where(step)}: {f} does not exist in the checkout"
        self.ran.append(Ran(step, cmd, 0.0, note="not run: " + NOT_RUN["install"]))

    def _download(self, step: Step, cmd: str) -> None:
        if cmd.startswith("hf auth login"):
            self.ran.append(Ran(step, cmd, 0.0, note="not run: " + NOT_RUN["login"]))
            return
        if not cmd.startswith("hf download "):
            self._bash(step, cmd)
            return
        repo_id, files, local_dir = parse_hf_download(cmd)
        t0 = time.time()
        if local_dir:  # as `hf download` resolves it: from the directory the command runs in
            local_dir = os.path.join(self.root, self._expand(local_dir))
        written = self.standins.place(repo_id, self.hf_home, local_dir, files)
        self.ran.append(Ran(step, cmd, time.time() - t0, note=f"stand-in, {len(written)} path(s)"))

    def _serve(self, step: Step, cmd: str) -> None:
        """Start the server (the command may put itself in the background: its exit status 0 is not
        the end of the server) and wait until GET /health answers."""
        m = re.search(r"--port[= ](\d+)", cmd)
        if not m:
            raise AssertionError(f"{self.where(step)}: a serve step names its --port=N")
        self.ports[m.group(1)] = str(free_port())
        run = self._substitute(cmd)
        log = tempfile.NamedTemporaryFile("w+", suffix=".log", delete=False)
        t0 = time.time()
        proc = subprocess.Popen(["bash", "-c", self._script(run)], cwd=self.root, env=self.env, stdout=log,
                                stderr=subprocess.STDOUT, start_new_session=True)
        self.servers.append((proc, log.name))
        url = f"http://127.0.0.1:{self.ports[m.group(1)]}/health"
        while True:
            if proc.poll() not in (None, 0):
                raise AssertionError(f"{self.where(step)}: the retriever exited {proc.returncode}: {run}\n"
                                     + open(log.name).read()[-4000:])
            try:
                with urllib.request.urlopen(url, timeout=2) as r:
                    if r.status == 200:
                        break
            except OSError:
                pass
            if time.time() - t0 > self.timeout_s:
                raise AssertionError(f"{self.where(step)}: the retriever did not answer {url}:\n"
                                     + open(log.name).read()[-4000:])
            time.sleep(0.3)
        req = urllib.request.Request(url.replace("/health", "/retrieve"), method="POST",
                                     data=json.dumps({"queries": [PROBE], "topk": 3, "return_scores": True}).encode(),
                                     headers={"Content-Type": "application/json"})
        with urllib.request.urlopen(req, timeout=60) as r:  # kept for the test to check against faiss
            answer = r.read().decode()
        self.ran.append(Ran(step, run, time.time() - t0, answer, note=f"in the background, {url} answers"))

    def _launch(self, step: Step, cmd: str, remote: bool) -> None:
        run = self._substitute(cmd)
        if remote:
            run = re.sub(r"\s--distributed\b", "", run)
        if LAUNCH.search(run) and step.kind in SCALE:
            run = run + " " + " ".join(shlex.quote(a) for a in SCALE[step.kind])
            if step.kind == "train" and self.devices == 1:  # a tuple flag is given once: replaced, not appended
                run, n = re.subn(r"--config\.mesh\.shape=('[^']*'|\"[^\"]*\"|\S+)", "--config.mesh.shape='(1,1,1)'",
                                 run)
                run += "" if n else " --config.mesh.shape='(1,1,1)'"
        self._bash(step, run, note="" if not remote else "on one host")

    def _command(self, step: Step, cmd: str, remote: bool = False) -> None:
        if step.kind == "env":
            if "standin" in step.options:
                cmd = re.sub(r"^export\s+(\w+)=.*$", rf"export \1={step.options['standin']}", cmd)
            self.prelude.append(cmd)
            self.ran.append(Ran(step, cmd, 0.0, note="exported for the later steps"))
        elif SYSTEM_SETUP.match(cmd):
            self.ran.append(Ran(step, cmd, 0.0, note="not run: " + NOT_RUN["worker"]))
        elif step.kind == "install":
            self._install(step, cmd)
        elif step.kind in NOT_RUN:
            self.ran.append(Ran(step, cmd, 0.0, note="not run: " + NOT_RUN[step.kind]))
        elif step.kind == "download":
            self._download(step, cmd)
        elif step.kind == "serve":
            self._serve(step, cmd)
        else:
            self._launch(step, cmd, remote)

    def where(self, step: Step) -> str:
        return f"{os.path.relpath(self.recipe, REPO)}:{step.line} ({step.kind})"

    def run(self) -> list[Ran]:
        try:
            for step in self.steps:
                for cmd in step.commands:
                    if step.kind in ("cloud", "alternative", "sbatch"):
                        self._command(step, cmd)
                        continue
                    pieces = parts(cmd)
                    for piece in pieces:
                        self._command(step, piece, remote=pieces != [cmd])
        finally:
            self.stop()
        return self.ran

    def stop(self) -> None:
        """Stop every server this rehearsal started: its whole process group, which also holds a server
        the command put in the background itself (`nohup ... &`) after its shell exited."""
        for proc, log in self.servers:
            for sig in (signal.SIGTERM, signal.SIGKILL):
                try:
                    os.killpg(proc.pid, sig)
                except ProcessLookupError:
                    break
                deadline = time.time() + 15
                while time.time() < deadline and _group_alive(proc.pid):
                    time.sleep(0.2)
                    proc.poll()
                if not _group_alive(proc.pid):
                    break
            proc.poll()
            os.remove(log)
        self.servers.clear()

    def table(self) -> str:
        """One line per command: seconds, kind, what happened."""
        rows = [f"{r.seconds:6.1f} s {r.cpu_s:6.1f} cpu-s  {r.step.kind:<10} {r.note or 'ran'}: {r.command[:100]}"
                for r in self.ran]
        return "\n".join([os.path.relpath(self.recipe, REPO)] + rows + [
            f"{sum(r.seconds for r in self.ran):6.1f} s {sum(r.cpu_s for r in self.ran):6.1f} cpu-s  total "
            "(the retriever's own cpu time not counted)"])
