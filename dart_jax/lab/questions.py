"""Questions over a lab world with two independent dials: hops h (1..3 passages looked up in sequence,
each bridge entity named only in the previous passage) and a reasoning operation r (none, compare,
diff, sum, count, bool) applied to what the lookups found.

A question follows one relation path from each of its start entities (1 start for none / bool, 2 for
compare / diff / sum, 3 for count): h-1 relations lead to an end entity, whose passage gives the
target (an attribute, or for r = none also a relation's name). Only the start entities are named in
the question. Each row is the QA reader's format plus a "lab" field:

    {"id", "question", "golden_answers", "data_source": "lab",
     "lab": {"hops", "op", "chain": [ids in lookup order], "titles": [their names],
             "values": [{"entity", "attr", "value"}, ...],   # every value read on the way, in order
             "answer": golden_answers[0],
             "spec": {"starts", "path", "target", ...}}}      # the question's program (check_answer)

Answers are short strings Search-R1's EM compares: a name, a number (digits; small numbers also as a
word) or yes / no.
"""

from __future__ import annotations

import random
import re

from dart_jax.errors import UserError
from dart_jax.lab.world import ATTRIBUTES, KINDS, RELATIONS, World

OPS = ("none", "compare", "diff", "sum", "count", "bool")
HOPS = (1, 2, 3)
BRANCHES = {"none": 1, "bool": 1, "compare": 2, "diff": 2, "sum": 2, "count": 3}
_WORDS = ("zero", "one", "two", "three", "four", "five", "six", "seven", "eight", "nine", "ten", "eleven", "twelve")

# noun phrases that follow a relation from x (several per relation; nested for h >= 2)
_REL_NP = {
    "employer": ("the employer of {x}", "the organisation that employs {x}"),
    "birthplace": ("the birthplace of {x}", "the town where {x} was born"),
    "founder": ("the founder of {x}", "the person who founded {x}"),
    "headquarters": ("the headquarters town of {x}", "the town where {x} is based"),
    "mayor": ("the mayor of {x}",),
    "author": ("the author of {x}", "the person who wrote {x}"),
    "publisher": ("the publisher of {x}", "the organisation that published {x}"),
}
# r = none, the target read from the end entity's passage
_ASK = {
    "born": ("In what year was {e} born?", "What is the birth year of {e}?"),
    "awards": ("How many awards has {e} received?",),
    "role": ("What is the profession of {e}?", "What does {e} work as?"),
    "founded": ("In what year was {e} founded?", "When was {e} founded?"),
    "employees": ("How many employees does {e} have?", "How many people does {e} employ?"),
    "field": ("In what field does {e} work?", "What is the main trade of {e}?"),
    "population": ("What is the population of {e}?", "How many people live in {e}?"),
    "region": ("In which region is {e}?", "What region does {e} lie in?"),
    "published": ("In what year was {e} published?", "When was {e} first published?"),
    "pages": ("How many pages does {e} have?",),
    "genre": ("What kind of work is {e}?", "What is the genre of {e}?"),
    "employer": ("Which organisation employs {e}?", "Who is the employer of {e}?"),
    "birthplace": ("Where was {e} born?", "In which town was {e} born?"),
    "founder": ("Who founded {e}?",),
    "headquarters": ("Where is {e} based?", "In which town is {e} headquartered?"),
    "mayor": ("Who is the mayor of {e}?",),
    "author": ("Who wrote {e}?", "Who is the author of {e}?"),
    "publisher": ("Who published {e}?", "Which organisation published {e}?"),
}
_YEAR_VERB = {"born": "born", "founded": "founded", "published": "published"}
# counts: a measure phrase, the comparative words (more, fewer), a "more than T" predicate
_COUNT = {
    "awards": ("the number of awards of {e}", ("more awards", "fewer awards"), "received more than {t} awards"),
    "employees": ("the number of employees of {e}", ("more employees", "fewer employees"),
                  "employ more than {t} people"),
    "population": ("the population of {e}", ("a larger population", "a smaller population"),
                   "have a population above {t}"),
    "pages": ("the page count of {e}", ("more pages", "fewer pages"), "have more than {t} pages"),
}
_IS = {"role": "Is {e} {v_an}?", "genre": "Is {e} {v_an}?", "field": "Does {e} work in {v}?",
       "region": "Is {e} in the {v} region?"}


def _cap(s: str) -> str:
    return s[0].upper() + s[1:]


def _an(v: str) -> str:
    return ("an " if v[0] in "aeiou" else "a ") + v


def _golds(answer: str) -> list[str]:
    if answer.isdigit() and int(answer) < len(_WORDS):
        return [answer, _WORDS[int(answer)]]
    return [answer]


def follow(world: World, start: str, path: list) -> list[str]:
    """The entity ids visited from `start` along relation `path` (start included)."""
    out = [start]
    for r in path:
        out.append(world.entities[out[-1]].rels[r])
    return out


def _read(world: World, eid: str, target: str):
    e = world.entities[eid]
    return e.attrs[target] if target in e.attrs else world.entities[e.rels[target]].name


def check_answer(world: World, row: dict) -> str:
    """The answer of `row`, recomputed from the world's facts and the row's program alone (never its
    stored chain, values or answer)."""
    lab = row["lab"]
    spec, op = lab["spec"], lab["op"]
    ends = [follow(world, s, spec["path"])[-1] for s in spec["starts"]]
    vals = [_read(world, e, spec["target"]) for e in ends]
    if op == "none":
        return str(vals[0])
    if op == "compare":
        pick = min(vals) if spec["cmp"] == "min" else max(vals)
        return world.entities[ends[vals.index(pick)]].name
    if op == "diff":
        return str(abs(vals[0] - vals[1]))
    if op == "sum":
        return str(vals[0] + vals[1])
    if op == "count":
        return str(sum(_test(v, spec) for v in vals))
    if op == "bool":
        return "yes" if _test(vals[0], spec) else "no"
    raise UserError(f"lab question {row.get('id')}: unknown operation {op!r}; use one of {OPS}")


def _test(v, spec: dict) -> bool:
    return {"lt": lambda: v < spec["threshold"], "gt": lambda: v > spec["threshold"],
            "eq": lambda: v == spec["value"]}[spec["test"]]()


def _kind_paths(kind: str, n: int) -> list[tuple[tuple, str]]:
    """Every (relation path of length n, end kind) from `kind`."""
    if n == 0:
        return [((), kind)]
    return [((r, *p), end) for r, k in RELATIONS[kind].items() for p, end in _kind_paths(k, n - 1)]


def _targets(kind: str, op: str) -> list[str]:
    types = ATTRIBUTES[kind]
    if op == "none":
        return [*types, *RELATIONS[kind]]
    if op in ("compare", "diff", "count"):
        return [a for a, t in types.items() if t in ("year", "count")]
    if op == "sum":
        return [a for a, t in types.items() if t == "count"]
    return list(types)  # bool: a threshold on a number or a word's identity


def _np(rng: random.Random, name: str, path: tuple) -> str:
    x = name
    for r in path:
        x = rng.choice(_REL_NP[r]).format(x=x)
    return x


def _one(world: World, rng: random.Random, h: int, op: str, by_kind: dict) -> dict | None:
    """One question of cell (h, op), or None when the draw is rejected (ties, shared entities, ...)."""
    kind = rng.choice(KINDS)
    paths = [(p, end) for p, end in _kind_paths(kind, h - 1) if _targets(end, op)]
    path, end_kind = rng.choice(paths)
    target = rng.choice(_targets(end_kind, op))
    starts = rng.sample(by_kind[kind], BRANCHES[op])
    branches = [follow(world, s, list(path)) for s in starts]
    chain = [i for b in branches for i in b]
    if len(set(chain)) != len(chain):  # a cycle, or two branches meeting: no clean lookup sequence
        return None
    vals = [_read(world, b[-1], target) for b in branches]
    names = [world.entities[s].name for s in starts]
    phrases = [_np(rng, n, path) for n in names]
    spec = {"starts": starts, "path": list(path), "target": target}
    typ = ATTRIBUTES[end_kind].get(target, "rel")
    if op == "none":
        question = rng.choice(_ASK[target]).format(e=phrases[0])
    elif op == "compare":
        if vals[0] == vals[1]:
            return None
        spec["cmp"] = rng.choice(("min", "max"))
        a, b = phrases
        who = "Who" if end_kind == "person" else "Which"
        if typ == "year":
            word = "earlier" if spec["cmp"] == "min" else "later"
            question = f"{who} was {_YEAR_VERB[target]} {word}: {a} or {b}?"
        else:
            word = _COUNT[target][1][0 if spec["cmp"] == "max" else 1]
            question = f"{who} has {word}: {a} or {b}?"
    elif op == "diff":
        if vals[0] == vals[1]:
            return None
        a, b = phrases
        if typ == "year":
            question = rng.choice((f"How many years apart were {a} and {b} {_YEAR_VERB[target]}?",
                                   f"How many years passed between the years {a} and {b} were {_YEAR_VERB[target]}?"))
        else:
            m = _COUNT[target][0]
            question = f"What is the difference between {m.format(e=a)} and {m.format(e=b)}?"
    elif op == "sum":
        m = _COUNT[target][0]
        question = rng.choice((f"What is the sum of {m.format(e=phrases[0])} and {m.format(e=phrases[1])}?",
                               f"What is {m.format(e=phrases[0])} plus {m.format(e=phrases[1])}?"))
    elif op == "count":
        lo, hi = min(vals), max(vals)
        pad = max(1, (hi - lo) // 3)
        options = [t for t in range(max(0, lo - pad), hi + pad + 1) if t not in vals]
        spec["threshold"] = rng.choice(options)
        listed = f"{phrases[0]}, {phrases[1]} and {phrases[2]}"
        if typ == "year":
            spec["test"] = rng.choice(("lt", "gt"))
            word = "before" if spec["test"] == "lt" else "after"
            question = f"How many of {listed} were {_YEAR_VERB[target]} {word} {spec['threshold']}?"
        else:
            spec["test"] = "gt"
            question = f"How many of {listed} {_COUNT[target][2].format(t=spec['threshold'])}?"
    elif op == "bool":
        yes = rng.random() < 0.5
        v = vals[0]
        if typ == "str":
            pool = sorted({e.attrs[target] for e in world.entities.values() if e.kind == end_kind} - {v})
            spec.update(test="eq", value=v if yes else rng.choice(pool))
            question = _IS[target].format(e=phrases[0], v=spec["value"], v_an=_an(spec["value"]))
        else:
            spec["test"] = rng.choice(("lt", "gt"))
            d = rng.randint(1, 30) if typ == "year" else rng.randint(1, max(1, v // 4))
            spec["threshold"] = (v + d if yes else v - d) if spec["test"] == "lt" else (v - d if yes else v + d)
            if typ == "year":
                word = "before" if spec["test"] == "lt" else "after"
                question = f"Was {phrases[0]} {_YEAR_VERB[target]} {word} {spec['threshold']}?"
            else:
                word = "less" if spec["test"] == "lt" else "more"
                question = f"Is {_COUNT[target][0].format(e=phrases[0])} {word} than {spec['threshold']}?"
    else:
        raise UserError(f"lab operation {op!r} is unknown; use one of {OPS}")
    question = _cap(question)
    # only the start entities may be named: a bridge (or end) entity's name in the text is a leak
    for i in chain:
        if i not in starts and re.search(r"\b" + re.escape(world.entities[i].name) + r"\b", question, re.I):
            return None
    values = []
    for b in branches:
        for cur, nxt, r in zip(b, b[1:], path):
            values.append({"entity": cur, "attr": r, "value": world.entities[nxt].name})
        values.append({"entity": b[-1], "attr": target, "value": _read(world, b[-1], target)})
    row = {"question": question, "data_source": "lab",
           "lab": {"hops": h, "op": op, "chain": chain, "titles": [world.entities[i].name for i in chain],
                   "values": values, "spec": spec}}
    answer = check_answer(world, row)
    row["golden_answers"] = _golds(answer)
    row["lab"]["answer"] = answer
    return row


def make_questions(world: World, n: int, hops: tuple = HOPS, ops: tuple = OPS, seed: int = 0) -> list[dict]:
    """`n` questions per (h, op) cell, cells in the order of hops × ops, no question text twice;
    deterministic from (world, n, hops, ops, seed). Ids: lab{world seed}-q{k:06d}."""
    bad = [h for h in hops if h not in HOPS] + [o for o in ops if o not in OPS]
    if bad:
        raise UserError(f"lab questions: {bad} not a dial setting; hops in {HOPS}, ops in {OPS}")
    rng = random.Random(f"dart_jax.lab.questions/{world.seed}/{int(seed)}")
    by_kind = {k: [i for i, e in world.entities.items() if e.kind == k] for k in KINDS}
    rows, seen = [], set()
    for h in hops:
        for op in ops:
            got, tries = 0, 0
            while got < n:
                tries += 1
                if tries > 200 * n + 1000:
                    raise UserError(f"lab questions: only {got} of {n} distinct questions for hops={h}, op={op} "
                                    f"in this world; ask for fewer or use a larger world")
                row = _one(world, rng, h, op, by_kind)
                if row is None or row["question"] in seen:
                    continue
                seen.add(row["question"])
                rows.append({"id": f"lab{world.seed}-q{len(rows):06d}", **row})
                got += 1
    return rows


def summary(world: World, rows: list[dict]) -> dict:
    """The generator's statistics: entities per kind, questions per (hops, op) cell, answer types,
    yes share of bool questions, passage and question lengths in words."""
    kinds: dict = {}
    for e in world.entities.values():
        kinds[e.kind] = kinds.get(e.kind, 0) + 1
    cells: dict = {}
    types: dict = {}
    yes = [0, 0]
    for r in rows:
        key = f"h{r['lab']['hops']}-{r['lab']['op']}"
        cells[key] = cells.get(key, 0) + 1
        a = r["lab"]["answer"]
        t = "yes/no" if a in ("yes", "no") else "number" if a.isdigit() else "name" if world.by_name(a) else "word"
        types[t] = types.get(t, 0) + 1
        if r["lab"]["op"] == "bool":
            yes[0] += a == "yes"
            yes[1] += 1
    words = sorted(len(p.split()) for p in world.passages.values())
    qwords = sorted(len(r["question"].split()) for r in rows) or [0]
    return {"seed": world.seed, "entities": kinds, "passages": len(world.passages),
            "passage_words": {"min": words[0], "median": words[len(words) // 2], "max": words[-1]},
            "questions": len(rows), "cells": cells, "answer_types": types,
            "bool_yes_share": round(yes[0] / yes[1], 3) if yes[1] else None,
            "question_words": {"min": qwords[0], "median": qwords[len(qwords) // 2], "max": qwords[-1]}}
