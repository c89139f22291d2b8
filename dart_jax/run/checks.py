"""What a run needs outside itself, checked before any model loads (launch.preflight, the hook in
launch.train; evaluation checks its retriever the same way), so that a wrong path or a dead retriever
fails in seconds with what to do, not after model load, compile and 300 s of retries.

    retriever   QA: `retriever.url` answers one real query (a dead port fails in seconds);
                `retriever.index_dir` holds meta.json and its files; neither: the shipped sample index
    databases   SQL: every `db_root` exists and holds the databases its rows name (a sample)
    datasets    every `data.train` / `eval.data` file exists
    weights     `model.path` resolves (a path, an embedded name, a hub id in the local HF cache);
                `warm_start` / `init_from` exist

The mesh and memory checks, which need the run spec's rules and compiled programs, are in
dart_jax/preflight/. `architecture` reads the model's config.json, or, when the weights are absent,
the paper models' architectures shipped in data/model_configs/<Org>/<Name>/config.json.
"""

from __future__ import annotations

import dataclasses
import glob
import json
import os
import socket
import time
import urllib.parse
from typing import Any

from dart_jax.data.paths import DATA, REPO, repo_path
from dart_jax.data.settings import prepare_hint
from dart_jax.errors import UserError
from dart_jax.run.spec import RunSpec

GIB = 2 ** 30
MODEL_CONFIGS = os.path.join(DATA, "model_configs")
PREPARED_BY = {"search_r1_parquet": "qa", "skyrl_sql": "sql"}  # readers of the files launch.prepare_data writes
SQL_READERS = ("spider", "bird", "skyrl_sql")
DB_SAMPLE = 64          # databases checked per training set
CONNECT_TIMEOUT_S = 3.0  # the retriever's port: refused or unreachable is known at once
QUERY_TIMEOUT_S = 30.0   # one real query: a cold Search-R1 server over 21M passages takes seconds


@dataclasses.dataclass
class Check:
    """One check's outcome: `status` ok | FAIL | skipped, `message` one line (a failure says what is
    wrong; what to do), `data` the figures behind it (tests, --json)."""
    name: str
    status: str
    message: str
    data: dict = dataclasses.field(default_factory=dict)

    @property
    def failed(self) -> bool:
        return self.status == "FAIL"

    def line(self) -> str:
        return f"{self.name:<10} {self.status}: {self.message}"


@dataclasses.dataclass
class Report:
    checks: list[Check]

    @property
    def ok(self) -> bool:
        return not any(c.failed for c in self.checks)

    def lines(self) -> list[str]:
        return [c.line() for c in self.checks]

    def as_dict(self) -> dict:
        return {"ok": self.ok, "checks": {c.name: {"status": c.status, "message": c.message, **c.data}
                                          for c in self.checks}}


def ok(name: str, message: str, **data) -> Check:
    return Check(name, "ok", message, data)


def fail(name: str, message: str, **data) -> Check:
    return Check(name, "FAIL", message, data)


def skipped(name: str, message: str, **data) -> Check:
    return Check(name, "skipped", message, data)


# -- retriever ----------------------------------------------------------------------------------------
def check_retriever(spec: RunSpec) -> Check:
    """QA only: the URL answers one real query, or the index directory is complete."""
    if spec.task != "qa":
        return skipped("retriever", f"task {spec.task!r} has no retriever")
    rc = spec.retriever
    if rc.url:
        return probe_url(rc.url, int(rc.topk))
    if rc.index_dir:
        return check_index_dir(repo_path(rc.index_dir))
    corpus = repo_path(rc.corpus)
    if not os.path.isfile(corpus):
        return fail("retriever", f"retriever.corpus={rc.corpus} not found; set --config.retriever.corpus to a "
                                 "jsonl corpus, or serve an index and set --config.retriever.url")
    if rc.kind == "lexical":
        return ok("retriever", f"the local lexical index of {rc.corpus} (built on first use)")
    return ok("retriever", f"the local index of {rc.corpus} with encoder {rc.encoder} (built on first use)")


def probe_url(url: str, topk: int) -> Check:
    """One real query against `url` with short deadlines: the port must accept a connection within
    CONNECT_TIMEOUT_S (Search-R1's own server has no /health, so the query itself is the check)."""
    from dart_jax.tools.retrieval_server import RemoteRetriever
    client = RemoteRetriever(url, timeout_s=QUERY_TIMEOUT_S, deadline_s=QUERY_TIMEOUT_S)
    parts = urllib.parse.urlsplit(client.url)
    host, port = parts.hostname, parts.port or (443 if parts.scheme == "https" else 80)
    serve = "start it (python -m launch.serve_retriever --index=DIR --port=PORT) or fix --config.retriever.url"
    if parts.scheme not in ("http", "https") or not host:
        return fail("retriever", f"retriever.url={url!r} is not an http(s) URL; {serve}")
    t0 = time.perf_counter()
    try:
        socket.create_connection((host, port), timeout=CONNECT_TIMEOUT_S).close()
    except OSError as e:
        return fail("retriever", f"retriever.url={url} does not accept connections ({type(e).__name__}: "
                                 f"{getattr(e, 'strerror', None) or e}); {serve}", url=client.url)
    try:
        hits = client.search(["who wrote the declaration of independence"], max(1, topk))
    except (RuntimeError, ValueError, KeyError, TypeError) as e:
        return fail("retriever", f"retriever.url={url} did not answer a query: {e}; {serve}", url=client.url)
    seconds = time.perf_counter() - t0
    docs = hits[0] if hits else []
    if not docs or not all(isinstance(d, dict) and "contents" in d for d, _ in docs):
        return fail("retriever", f"retriever.url={url} answered without passages ({len(docs)} results, each "
                                 "needs a 'contents' field, as Search-R1's server returns); point it at a "
                                 "Search-R1-compatible server", url=client.url)
    return ok("retriever", f"{client.url} answered a query in {seconds:.2f} s ({len(docs)} passages)",
              url=client.url, seconds=seconds, passages=len(docs))


def check_index_dir(index_dir: str) -> Check:
    from dart_jax.tools.retrieval import CORPUS, INDEX, LAYOUT, META
    fix = ("build one with python -m launch.build_index (or adopt Search-R1's e5_Flat.index: "
           "python -m launch.build_index --adopt=PATH/e5_Flat.index --corpus=PATH/wiki-18.jsonl "
           "--encoder=intfloat/e5-base-v2 --out=DIR)")
    meta_path = os.path.join(index_dir, META)
    if not os.path.isfile(meta_path):
        return fail("retriever", f"retriever.index_dir={index_dir} has no {META}; {fix}")
    try:
        with open(meta_path) as f:
            meta = json.load(f)
    except (OSError, ValueError) as e:
        return fail("retriever", f"{meta_path} cannot be read ({e}); {fix}")
    if meta.get("retriever") == "lexical":
        from dart_jax.tools.lexical import DB
        if not os.path.isfile(os.path.join(index_dir, DB)):
            return fail("retriever", f"retriever.index_dir={index_dir} lacks {DB}; build it again with python -m "
                                     "launch.build_index --kind=lexical")
        return ok("retriever", f"lexical index {index_dir}: {meta.get('count', '?')} passages", index_dir=index_dir)
    if meta.get("layout") != LAYOUT:
        return fail("retriever", f"retriever.index_dir={index_dir} was written by an older launch.build_index (no "
                                 f"passage offset table); {fix}")
    names = [INDEX, CORPUS] + ([meta["offsets"]] if meta.get("offsets") else [])
    missing = [n for n in names if not os.path.exists(os.path.join(index_dir, n))]  # a dangling link too
    if missing:
        return fail("retriever", f"retriever.index_dir={index_dir} lacks {', '.join(missing)} (a link whose target "
                                 f"moved counts as missing); {fix}")
    return ok("retriever", f"index {index_dir}: {meta.get('count', '?')} passages, encoder {meta.get('encoder')}",
              index_dir=index_dir)


# -- data -----------------------------------------------------------------------------------------------
def _data_path(path: str) -> str:
    """A dataset path as `readers.load_rows` resolves it."""
    return path if os.path.isabs(path) or os.path.exists(path) else os.path.join(REPO, path)


def check_datasets(spec: RunSpec) -> Check:
    """Every training and held-out file exists (a missing training file names the command that writes it)."""
    entries = [(f"data.train[{i}]", dict(s)) for i, s in enumerate(spec.data_train)]
    ec = spec.eval
    if spec.eval.n and spec.eval.data:
        entries += [(f"eval.data[{i}]", dict(s)) for i, s in enumerate(spec.eval.data)]
    if not spec.data_train:
        return fail("datasets", "config.data.train is empty; list the training sets (configs/base.py, or a "
                                "paper config's, which python -m launch.prepare_data writes)")
    for field, spec in entries:
        if spec.get("reader") == "tfds":
            continue
        setting = spec.get("prepare") or PREPARED_BY.get(spec.get("reader"))
        how = (prepare_hint(setting, spec.get("path") or "") if field.startswith("data.train") and setting
               else "fix the path")
        if not spec.get("path"):
            return fail("datasets", f"{field}.path is empty; {how} (or set --config.{field}.path=FILE)", field=field)
        path = _data_path(spec["path"])
        if not os.path.isfile(path):
            return fail("datasets", f"{field}.path={spec['path']} not found; {how} "
                                    f"(or set --config.{field}.path=FILE)", field=field, path=path)
    if ec.n and ec.data and ec.corpus and not os.path.isfile(_data_path(ec.corpus)):
        return fail("datasets", f"eval.corpus={ec.corpus} not found: the held-out questions' corpus "
                                "(a lab world: python -m launch.lab_build --seed=1 --out=DIR writes DIR/corpus.jsonl)",
                    field="eval.corpus")
    return ok("datasets", f"{len(entries)} file(s) found", files=len(entries))


def check_databases(spec: RunSpec) -> Check:
    """SQL sets: each db_root exists and a sample of the databases the rows name is there."""
    sets = [(i, dict(s)) for i, s in enumerate(spec.data_train) if dict(s).get("reader") in SQL_READERS]
    if not sets:
        return skipped("databases", "no SQL training set")
    from dart_jax.data.readers import db_roots, load_rows
    checked = 0
    for i, spec in sets:
        field = f"data.train[{i}].db_root"
        roots = [_data_path(r) for r in db_roots(spec.get("db_root"))]
        fix = ("point it at OmniSQL's data/ folder (holding SynSQL-2.5M/databases, spider/database, "
               "bird/train/train_databases)" if spec["reader"] == "skyrl_sql" else "point it at the databases' folder")
        absent = [r for r in roots if not os.path.isdir(r)]
        if absent:
            return fail("databases", f"{field}={absent[0]} is not a directory; {fix}", field=field)
        if not os.path.isfile(_data_path(spec.get("path") or "")):
            if not roots:  # a prepared file carries its rows' databases; without the file, nothing says where
                return fail("databases", f"{field} is empty; {fix}: --config.{field}=DIR")
            continue  # the datasets check names the missing file
        try:  # rows written by launch.prepare_data carry their database's path; others find it under db_root
            rows = load_rows(dict(spec, db_root=roots, exclude=()), REPO, require_db=False)
        except (ValueError, OSError) as e:
            return fail("databases", f"data.train[{i}] cannot be read: {e}; fix the file or --config.data.train[{i}]")
        if not roots and not all(r.get("db_path") for r in rows):
            return fail("databases", f"{field} is empty and data.train[{i}]'s rows name no database file; {fix}: "
                                     f"--config.{field}=DIR", field=field)
        paths = sorted({r["db_path"] for r in rows})
        step = max(1, len(paths) // DB_SAMPLE)
        sample = paths[::step][:DB_SAMPLE]
        missing = [p for p in sample if not os.path.isfile(p)]
        checked += len(sample)
        if missing:
            return fail("databases", f"{field}: {len(missing)} of {len(sample)} sampled databases missing (e.g. "
                                     f"{missing[0]}); {fix}", field=field, checked=len(sample), missing=len(missing))
    return ok("databases", f"{checked} of the databases the rows name checked, all present", checked=checked)


# -- weights --------------------------------------------------------------------------------------------
def check_weights(spec: RunSpec) -> Check:
    """model.path resolves to weights (models.names.resolve), warm_start / init_from are what they claim."""
    from dart_jax.checkpoints.dart_io import MANIFEST
    from dart_jax.models.names import is_gguf, resolve
    from dart_jax.run.policy import init_source
    from dart_jax.run.source import classify_source
    try:
        path = resolve(spec.model.path)
    except FileNotFoundError as e:
        return fail("weights", f"model.path: {e}")
    if not (is_gguf(path) or os.path.isfile(os.path.join(path, "config.json"))):
        return fail("weights", f"model.path={spec.model.path} resolves to {path}, which is neither a .gguf file "
                               "nor an HF model directory with config.json; set --config.model.path")
    for field, value in (("warm_start", spec.warm_start), ("init_from", spec.init_from)):
        if not value:
            continue
        where = repo_path(value)
        if field == "init_from":
            try:
                init_source(spec)
            except (FileNotFoundError, UserError) as e:
                return fail("weights", f"{e}; write one with launch.train (adapters/) or fix --config.init_from")
            continue
        kind = classify_source(where).kind if os.path.isdir(where) and os.path.isfile(
            os.path.join(where, MANIFEST)) else None
        if kind != "warm_start":
            return fail("weights", f"warm_start={value} is not a warm-start directory ({MANIFEST} of kind "
                                   "warm_start); write one with python -m launch.sft or fix --config.warm_start")
    return ok("weights", f"{spec.model.path} -> {path}", path=path)


def architecture(spec: RunSpec) -> tuple[Any, str]:
    """-> (ModelConfig with the model section's overrides, where it came from): the weights' config.json
    (or GGUF header), else the shipped preset of the same name; (None, why) when neither exists."""
    from dart_jax.checkpoints.registry import open_source
    from dart_jax.models.config import config_from_hf_dir
    from dart_jax.run.source import classify_source
    over = spec.model.overrides()
    path = spec.model.path
    init_from = repo_path(spec.init_from)
    has_config = init_from and os.path.isfile(os.path.join(init_from, "config.json"))
    if has_config and classify_source(init_from).kind == "hf":
        path = init_from  # an HF model as init_from replaces model.path (run.policy)
    try:
        _, cfg = open_source(path, **over)
        return cfg, path
    except (FileNotFoundError, ValueError):
        pass
    preset = preset_dir(path)
    if preset is None:
        return None, (f"no config.json for {path} and no architecture preset in "
                      f"{os.path.relpath(MODEL_CONFIGS, REPO)}/<Org>/<Name>")
    return config_from_hf_dir(preset, **over), (f"{os.path.relpath(preset, REPO)}/config.json (the weights are not "
                                                "present: their published architecture)")


def preset_dir(path: str) -> str | None:
    """data/model_configs/<Org>/<Name> for a hub id "Org/Name" or any path ending in <Name>."""
    parts = [p for p in path.replace("\\", "/").split("/") if p]
    if len(parts) >= 2 and os.path.isdir(os.path.join(MODEL_CONFIGS, parts[-2], parts[-1])):
        return os.path.join(MODEL_CONFIGS, parts[-2], parts[-1])
    if not parts:
        return None
    name = parts[-1].lower()
    hits = [d for d in glob.glob(os.path.join(MODEL_CONFIGS, "*", "*")) if os.path.basename(d).lower() == name]
    return hits[0] if hits else None
