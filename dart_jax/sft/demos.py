"""Warm-start demonstrations: protocol-following trajectories built from real data with the real tools.

A demonstration is one jsonl record, text pieces in order:

    {"id", "data_source", "task": "qa" | "sql", "question", "db_path" (sql), "origin",
     "pieces": [{"text": ..., "loss": 1}, {"text": <observation>, "loss": 0}, ...]}

Pieces with loss 1 are what the policy writes; loss-0 pieces are tool observations rendered exactly
as the agent renders them (`Protocol.render_observation`). `encode_demo` turns a record into the id
stream a rollout of the same behaviour produces: the task's chat prompt, each written piece
tokenised on its own, each observation tokenised alone and capped like the agent caps it
(`observation_ids`), so supervised warm start masks observations exactly as RL does.

Builders:
- `qa_demos`: question → `<think>` → `<search> question </search>` → the retriever's actual top-k
  passages → `<think>` naming the passage → `<answer> gold </answer>`. Only questions whose gold
  answer is visible in the (capped) observation are kept: a demonstration never answers from
  nothing.
- `sql_demos`: schema prompt → `<sql>` exploring a table the gold query reads, run by the real
  read-only executor → `<observation>` → `<solution> gold </solution>`; only gold queries that
  execute are kept.
- `distill_demos`: the correct trajectories saved by an RL or evaluation run (`rollouts.jsonl`,
  the DART authors' recipe), filtered to finished, balanced-tag ones.
"""

from __future__ import annotations

import json
import os
import re
from typing import Iterable

import numpy as np

from dart_jax.data.prompts import qa_question, qa_row_prompt, sql_prompt
from dart_jax.data.text import normalize_answer
from dart_jax.rewards.sql import execution_match
from dart_jax.rollout.agent import observation_ids
from dart_jax.rollout.protocol import PROTOCOLS, QA, SQL, Protocol
from dart_jax.rollout.tasks import encode_prompt
from dart_jax.run.records import read_rollouts
from dart_jax.tokenization.tokenizer import encode_text

_DOC = re.compile(r"Doc (\d+)\(Title:")
_TABLE = re.compile(r"\b(?:FROM|JOIN)\s+[`\"\[]?([A-Za-z_][A-Za-z0-9_]*)", re.I)


def write_demos(path: str, demos: Iterable[dict]) -> str:
    os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
    with open(path, "w") as f:
        for d in demos:
            f.write(json.dumps(d, ensure_ascii=False) + "\n")
    return path


def read_demos(path: str) -> list[dict]:
    if not os.path.isfile(path):
        raise FileNotFoundError(f"demonstration file {path} not found")
    out = []
    with open(path) as f:
        for k, line in enumerate(f):
            if not line.strip():
                continue
            d = json.loads(line)
            for field in ("id", "task", "question", "pieces"):
                if field not in d:
                    raise ValueError(f"{path}: line {k + 1} has no field {field!r}")
            if d["task"] not in PROTOCOLS:
                raise ValueError(f"{path}: line {k + 1} has task {d['task']!r}; expected one of {sorted(PROTOCOLS)}")
            out.append(d)
    return out


# -- QA ----------------------------------------------------------------------------------------------
def _evidence(visible: str, golds: list[str]) -> tuple[int, str] | None:
    """(1-based doc number, answer as written there) of the first passage holding a gold answer."""
    starts = [(m.start(), int(m.group(1))) for m in _DOC.finditer(visible)] or [(0, 1)]
    for i, (start, doc) in enumerate(starts):
        end = starts[i + 1][0] if i + 1 < len(starts) else len(visible)
        text = visible[start:end]
        norm = normalize_answer(text)
        for g in golds:
            ng = normalize_answer(g)
            if not ng or f" {ng} " not in f" {norm} ":
                continue
            m = re.search(re.escape(g), text, re.I)
            surface = m.group(0) if m and normalize_answer(m.group(0)) == ng else g
            return doc, surface
    return None


def _piece(*parts: str | tuple[str]) -> dict:
    """A trained piece from its parts; a part given as a 1-tuple is dataset text (a question, an
    answer, a table name, a gold query): `plain` records its character span, encoded as ordinary
    text so a question holding "<search>" never becomes a tag in a target (`encode_demo`)."""
    text, plain = "", []
    for part in parts:
        if isinstance(part, tuple):
            plain.append([len(text), len(text) + len(part[0])])
            part = part[0]
        text += part
    return {"text": text, "loss": 1, "plain": plain}


def qa_demos(rows: list[dict], tool, tokenizer, max_obs_tokens: int,
             protocol: Protocol = QA) -> tuple[list[dict], dict]:
    """Search-protocol demonstrations. `tool` is a RetrievalTool (real index); -> (demos, stats)."""
    queries = [qa_question(r["question"]).rstrip("?").strip() for r in rows]
    bodies = tool.batch(queries)
    demos, stats = [], {"rows": len(rows), "kept": 0, "no_evidence": 0}
    for r, q, body in zip(rows, queries, bodies):
        obs = protocol.render_observation(body)
        visible = tokenizer.decode(observation_ids(tokenizer, protocol, obs, max_obs_tokens), skip_special_tokens=True)
        found = _evidence(visible, r["golden_answers"])
        if found is None:
            stats["no_evidence"] += 1
            continue
        doc, answer = found
        pieces = [
            _piece(f"<think> I need to look this up. </think>\n{protocol.tool_open} ", (q,), f" {protocol.tool_close}"),
            {"text": obs, "loss": 0},
            _piece(f"<think> Doc {doc} answers the question. </think>\n{protocol.answer_open} ", (answer,),
                   f" {protocol.answer_close}"),
        ]
        demos.append({"id": r["id"], "data_source": r.get("data_source", "qa"), "task": "qa",
                      "question": r["question"], "golden_answers": r["golden_answers"], "origin": "retrieval",
                      "pieces": pieces})
    stats["kept"] = len(demos)
    return demos, stats


# -- SQL ---------------------------------------------------------------------------------------------
def _tables(db_path: str) -> list[str]:
    from dart_jax.tools.sqlite_exec import execute
    res = execute(db_path, "SELECT name FROM sqlite_master WHERE type = 'table' AND name NOT LIKE 'sqlite_%'")
    if not res.ok:
        raise ValueError(f"{db_path}: cannot list tables ({res.error})")
    return [r[0] for r in res.rows]


def sql_demos(rows: list[dict], tool, max_turns: int, protocol: Protocol = SQL) -> tuple[list[dict], dict]:
    """SkyRL-SQL-protocol demonstrations on the real databases. `tool` is a SQLiteTool."""
    demos, stats = [], {"rows": len(rows), "kept": 0, "gold_fails": 0, "no_table": 0}
    for r in rows:
        try:
            ok, _ = execution_match(r["db_path"], r["query"], r["query"])
        except ValueError:
            ok = False
        if not ok:
            stats["gold_fails"] += 1
            continue
        names = {t.lower(): t for t in _tables(r["db_path"])}
        used = [names[m.lower()] for m in _TABLE.findall(r["query"]) if m.lower() in names]
        if not used:
            stats["no_table"] += 1
            continue
        explore = f"SELECT * FROM {used[0]} LIMIT 3"
        body = tool.batch([explore], [r["db_path"]])[0]
        gold = " ".join(r["query"].split())
        pieces = [
            _piece("<think> The question needs the table ", (used[0],), ". Let me look at a few of its rows. "
                   f"</think>\n{protocol.tool_open} ", (explore,), f" {protocol.tool_close}"),
            {"text": protocol.render_observation(body, max_turns - 1), "loss": 0},
            _piece(f"<think> I can write the query now. </think>\n{protocol.answer_open} ", (gold,),
                   f" {protocol.answer_close}"),
        ]
        demos.append({"id": r["id"], "data_source": r.get("data_source", "sql"), "task": "sql",
                      "question": r["question"], "db_id": r.get("db_id", ""), "db_path": r["db_path"],
                      "query": r["query"], "origin": "sql_exploration", "pieces": pieces})
    stats["kept"] = len(demos)
    return demos, stats


# -- self-distillation ---------------------------------------------------------------------------------
def balanced(text: str, protocol: Protocol) -> bool:
    """Every tag pair opens and closes in order, and exactly one final answer ends the text."""
    for open_, close in (("<think>", "</think>"), (protocol.tool_open, protocol.tool_close),
                         (protocol.answer_open, protocol.answer_close)):
        depth = 0
        for m in re.finditer(re.escape(open_) + "|" + re.escape(close), text):
            depth += 1 if m.group(0) == open_ else -1
            if depth not in (0, 1):
                return False
        if depth:
            return False
    return text.count(protocol.answer_open) == 1 and text.rstrip().endswith(protocol.answer_close)


def distill_demos(path: str, min_score: float = 1.0, per_question: int = 1) -> tuple[list[dict], dict]:
    """Correct, finished, balanced trajectories of a saved run (`rollouts.jsonl`) as demonstrations."""
    if not os.path.isfile(path):
        raise FileNotFoundError(f"rollout file {path} not found (written by a run with output.save_rollouts)")
    stats = {"rows": 0, "kept": 0, "wrong": 0, "unfinished": 0, "unbalanced": 0, "duplicate": 0}
    demos, seen = [], {}
    # a last line cut short by a crash mid-write is skipped (logged): records.read_rollouts
    for r in read_rollouts(path):
        stats["rows"] += 1
        protocol = PROTOCOLS[r["task"]]
        written = "".join(p["text"] for p in r["pieces"] if p["loss"])
        if r["finish"] != "answer":
            stats["unfinished"] += 1
        elif float(r["score"]) < min_score:
            stats["wrong"] += 1
        elif not balanced(written, protocol):
            stats["unbalanced"] += 1
        elif seen.get(r["uid"], 0) >= per_question:
            stats["duplicate"] += 1
        else:
            seen[r["uid"]] = seen.get(r["uid"], 0) + 1
            d = {k: r[k] for k in ("data_source", "task", "question", "pieces") if k in r}
            d.update(id=r["uid"], origin="distill", step=r.get("step"))
            for k in ("db_path", "db_id", "golden_answers", "query"):
                if k in r:
                    d[k] = r[k]
            demos.append(d)
    stats["kept"] = len(demos)
    return demos, stats


# -- encoding ----------------------------------------------------------------------------------------
def task_prompt(demo: dict, mark=lambda v: v) -> str:
    if demo["task"] == "sql":
        return sql_prompt(demo["question"], demo["db_path"], demo.get("evidence", ""), mark)
    return qa_row_prompt(demo, mark)


def encode_demo(tokenizer, demo: dict, max_obs_tokens: int,
                prompt_tags: str = "atomic") -> tuple[list[int], list[int], list[float]]:
    """-> (prompt ids, response ids, response loss mask): the id stream of the agent loop."""
    protocol = PROTOCOLS[demo["task"]]
    prompt = encode_prompt(tokenizer, lambda mark: task_prompt(demo, mark), prompt_tags)
    ids: list[int] = []
    mask: list[float] = []
    for piece in demo["pieces"]:
        if piece["loss"]:  # the model's text; dataset text inside it (`plain` spans) stays ordinary text
            part = encode_text(tokenizer, piece["text"], [tuple(x) for x in piece.get("plain", ())])
        else:
            part = observation_ids(tokenizer, protocol, piece["text"], max_obs_tokens)
        ids += part
        mask += [float(bool(piece["loss"]))] * len(part)
    return prompt, ids, mask


def pack_rows(encoded: list[tuple[list[int], list[int], list[float]]]) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Right-padded (ids, positions with −1 on padding, loss mask) for encoded demos."""
    width = max(len(p) + len(r) for p, r, _ in encoded)
    b = len(encoded)
    ids = np.zeros((b, width), np.int32)
    pos = np.full((b, width), -1, np.int32)
    mask = np.zeros((b, width), np.float32)
    for i, (p, r, m) in enumerate(encoded):
        n = len(p) + len(r)
        ids[i, :n] = p + r
        pos[i, :n] = np.arange(n)
        mask[i, len(p):n] = m
    return ids, pos, mask
