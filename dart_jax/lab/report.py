"""The lab's measured figures: the generator's statistics and retrieval accuracy per query kind.

`world_statistics(world, questions, tokenizer)`: entities per kind, passage lengths in tokens (the corpus
row the retriever serves, title line included), questions per (hops, op) cell, question lengths in tokens
per hops, answer types. `tokenizer`: anything with `.encode(text)` (the SmolLM2 tokenizer the policy
reads with); None measures words instead.

`retrieval_accuracy(world, questions, searcher, k)`: does a query find the passage it should? Any object
with `search(queries, topk) -> [[(doc dict, score), ...]]` (tools.retrieval.Searcher; lab does not import
tools, the launch command builds the retriever). Query kinds, each as hits / total at every k with a 95%
Wilson interval:
  name          each distinct chain entity's exact name -> its passage
  name_attr     "NAME attr" for each distinct (chain entity, attribute the question reads from it), e.g.
                "Pomorn Brothers founded" -> Pomorn Brothers' passage
  question      the question text -> the FIRST chain entity's passage (what a first call must find)
  question_any  the question text -> any chain passage
  question_bridge  the question text -> any chain passage of an entity the question does not name (a bridge or
                an end entity; questions with hops >= 2): what copying the question cannot reach
"""

from __future__ import annotations

import math

from dart_jax.analysis.intervals import wilson_interval

KINDS = ("name", "name_attr", "question", "question_any", "question_bridge")


def _spread(xs: list) -> dict:
    """min / median / p90 / max of a list of ints (nearest-rank quantiles)."""
    if not xs:
        return {"n": 0}
    s = sorted(xs)

    def q(p):
        return s[min(len(s) - 1, max(0, math.ceil(p * len(s)) - 1))]
    return {"n": len(s), "min": s[0], "median": q(0.5), "p90": q(0.9), "max": s[-1],
            "mean": round(sum(s) / len(s), 1)}


def _answer_type(world, answer: str) -> str:
    if answer in ("yes", "no"):
        return "yes/no"
    if answer.isdigit():
        return "number"
    return "name" if world.by_name(answer) is not None else "word"


def world_statistics(world, questions: list[dict], tokenizer=None) -> dict:
    """The generator's statistics for one world and its questions (see the module docstring)."""
    unit = "tokens" if tokenizer is not None else "words"

    def size(text: str) -> int:
        return len(tokenizer.encode(text, add_special_tokens=False)) if tokenizer is not None else len(text.split())

    kinds: dict = {}
    for e in world.entities.values():
        kinds[e.kind] = kinds.get(e.kind, 0) + 1
    cells: dict = {}
    types: dict = {}
    q_len: dict = {}
    chain: dict = {}
    for r in questions:
        lab = r["lab"]
        key = f"h{lab['hops']}-{lab['op']}"
        cells[key] = cells.get(key, 0) + 1
        t = _answer_type(world, lab["answer"])
        types[t] = types.get(t, 0) + 1
        q_len.setdefault(f"h{lab['hops']}", []).append(size(r["question"]))
        chain.setdefault(f"h{lab['hops']}", []).append(len(lab["chain"]))
    bools = [r["lab"]["answer"] == "yes" for r in questions if r["lab"]["op"] == "bool"]
    return {"seed": world.seed, "unit": unit, "entities": dict(sorted(kinds.items())),
            "passages": len(world.passages),
            "passage_length": _spread([size(row["contents"]) for row in world.corpus_rows()]),
            "questions": len(questions), "cells": cells, "answer_types": dict(sorted(types.items())),
            "bool_yes_share": round(sum(bools) / len(bools), 3) if bools else None,
            "question_length": {h: _spread(v) for h, v in sorted(q_len.items())},
            "question_length_all": _spread([x for v in q_len.values() for x in v]),
            "chain_length": {h: _spread(v) for h, v in sorted(chain.items())}}


def _queries(world, questions: list[dict]) -> dict:
    """kind -> [(query, set of acceptable entity ids)], deduplicated for the entity-level kinds."""
    names, pairs, out = {}, {}, {k: [] for k in KINDS}
    for r in questions:
        lab = r["lab"]
        for eid in lab["chain"]:
            names.setdefault(eid, world.entities[eid].name)
        for v in lab["values"]:
            pairs.setdefault((v["entity"], v["attr"]), f"{world.entities[v['entity']].name} {v['attr']}")
        out["question"].append((r["question"], {lab["chain"][0]}))
        out["question_any"].append((r["question"], set(lab["chain"])))
        if lab["hops"] >= 2:
            out["question_bridge"].append((r["question"], set(lab["chain"]) - set(lab["spec"]["starts"])))
    out["name"] = [(q, {eid}) for eid, q in names.items()]
    out["name_attr"] = [(q, {eid}) for (eid, _), q in pairs.items()]
    return out


def retrieval_accuracy(world, questions: list[dict], searcher, k: tuple = (1, 3), batch: int = 256) -> dict:
    """kind -> {"total", "top{k}": {"hits", "rate", "wilson": [lo, hi]}} (see the module docstring).
    A passage is identified by its corpus id, lab{seed}-{entity id} (World.corpus_rows)."""
    prefix = f"lab{world.seed}-"
    topk = max(k)
    out = {}
    found: dict = {}  # query text -> entity ids of its top passages (the question kinds share their searches)
    for kind, items in _queries(world, questions).items():
        todo = list(dict.fromkeys(q for q, _ in items if q not in found))
        for i in range(0, len(todo), batch):
            for q, h in zip(todo[i:i + batch], searcher.search(todo[i:i + batch], topk)):
                found[q] = [d["id"][len(prefix):] if d["id"].startswith(prefix) else None for d, _ in h]
        ranked = [found[q] for q, _ in items]
        res = {"total": len(items)}
        for kk in k:
            hits = sum(any(eid in want for eid in got[:kk]) for (_, want), got in zip(items, ranked))
            lo, hi = wilson_interval(hits, len(items))
            res[f"top{kk}"] = {"hits": hits, "rate": round(hits / len(items), 4) if items else float("nan"),
                               "wilson": [round(lo, 4), round(hi, 4)]}
        if kind.startswith("question"):  # the same by hops: how far the question text alone gets
            res["by_hops"] = {}
            rows = questions if kind != "question_bridge" else [r for r in questions if r["lab"]["hops"] >= 2]
            for h in sorted({r["lab"]["hops"] for r in rows}):
                sel = [any(e in want for e in got[:topk]) for r, (_, want), got in zip(rows, items, ranked)
                       if r["lab"]["hops"] == h]
                res["by_hops"][f"h{h}"] = {f"top{topk}": round(sum(sel) / len(sel), 4), "total": len(sel)}
        out[kind] = res
    return out
