"""Lab demonstrations: multi-hop QA trajectories that follow a question's gold chain with the real tool.

One demonstration per question row (dart_jax/lab/questions.py), in the SFT demo format
(dart_jax/sft/demos.py: pieces with loss 1 for what the policy writes, loss 0 for observations):

    <think> what is known so far (values carried forward) + what is missing </think>
    <search> a query naming the next chain entity (never the question) </search>
    <information> the real retriever's top-k for that query </information>
    ... one search per chain entity ...
    <think> the known values + the operation worked out ("1932 − 1907 = 25") </think>
    <answer> gold </answer>

Queries name the start entity (from the question), then bridge entities read from earlier passages.
The observation is the configured tool's actual output, capped as the agent caps it; when the
chain passage (or one of its gold values) is not visible there, the demonstration reformulates once
(the name plus the attribute word, or the bare name) and is dropped and counted if that fails too.
Every step draws its phrasing from several templates with an RNG seeded by (seed, question id), so
the warm start teaches a skill rather than a sentence.
"""

from __future__ import annotations

import logging
import random
import re

from dart_jax.data.corpus import read_jsonl
from dart_jax.data.text import normalize_answer
from dart_jax.rollout.agent import observation_ids
from dart_jax.rollout.protocol import QA, Protocol

log = logging.getLogger(__name__)
OPS = ("none", "compare", "diff", "sum", "count", "bool")
MAX_RETRIES = 2  # reformulated queries after a missed lookup, before the demonstration is dropped
_DOC = re.compile(r"Doc (\d+)\(Title: ([^)\n]*)\)")

# -- phrasings ---------------------------------------------------------------------------------------
# {facts}: "; "-joined fact sentences; {need}: what the next lookup must give
KNOWN = ("So far I know: {facts}.", "Known so far: {facts}.", "From the passages read: {facts}.",
         "What I have: {facts}.", "The facts I have are: {facts}.", "Up to now, {facts}.")
NOTHING = ("Nothing is known yet.", "I have not read any passage yet.", "No facts yet.",
           "I start with no facts.", "Nothing looked up so far.")
FACT = ("{subject}'s {attr} is {value}", "the {attr} of {subject} is {value}", "{subject} has {attr} {value}",
        "{subject}: {attr} = {value}", "for {subject}, {attr} is {value}")
MISSING = ("I still need {need}.", "Missing: {need}.", "Next I need {need}.", "What I lack is {need}.",
           "I have to find {need}.", "Still unknown: {need}.")
NEED = ("the {attr} of {name}", "{name}'s {attr}", "the {attr} of {name}, not read yet", "{attr} of {name}")
NEED_PASSAGE = ("the passage on {name}", "what {name}'s page says", "{name}'s entry", "the facts about {name}")
LOOKUP = ("Let me search for {name}.", "I will look up {name}.", "Searching {name}.", "Look up {name} next.",
          "So I search {name}.")
REFORM = ("The passage on {name} is not in the results; I add a word.", "No page on {name} came back; "
          "let me rephrase.", "{name} is not among the results, so I search again.",
          "The results miss {name}; one more try.", "I did not get {name}'s passage; another query.")
# query forms: every one names the entity; {attr} is the attribute word, {kind} the entity kind
QUERY = ("{name}", "{name} {attr}", "{attr} {name}", "{name} {kind}", "{kind} {name}")
OP_NONE = ("That is the answer: {value}.", "So the answer is {value}.", "The answer is {value}.",
           "This gives {value}.", "Hence {value}.")
OP_COMPARE = ("{a} {rel} {b}, so the answer is {answer}.", "Comparing: {a} {rel} {b}; that points to {answer}.",
              "{sa} has {a} and {sb} has {b}; {a} {rel} {b}, so {answer}.",
              "Since {a} {rel} {b}, the answer is {answer}.", "{a} vs {b}: {a} {rel} {b}, giving {answer}.")
OP_DIFF = ("{hi} − {lo} = {d}.", "The difference is {hi} − {lo} = {d}.", "Subtracting: {hi} − {lo} = {d}.",
           "{hi} minus {lo} is {d}.", "So {hi} − {lo} gives {d}.")
OP_SUM = ("{terms} = {s}.", "Adding them: {terms} = {s}.", "The sum is {terms} = {s}.",
          "Together: {terms} = {s}.", "So {terms} makes {s}.")
OP_COUNT = ("Counting: {items}; that makes {n}.", "I count {items}: {n} in all.", "{items} — {n} of them.",
            "Listing them: {items}. The count is {n}.", "One by one: {items}; so {n}.")
COUNT_MARKS = (("(no)", "(yes)"), ("✗", "✓"), ("- no", "- yes"), ("(not counted)", "(counted)"))
OP_BOOL = ("{a} {rel} {b}, so the answer is {answer}.", "Checking: {a} {rel} {b}; {answer}.",
           "Since {a} {rel} {b}, {answer}.", "{a} against {b}: {a} {rel} {b}, so {answer}.",
           "The check gives {a} {rel} {b}: {answer}.")
TEMPLATES = {"known": KNOWN, "nothing": NOTHING, "fact": FACT, "missing": MISSING, "need": NEED,
             "need_passage": NEED_PASSAGE,
             "lookup": LOOKUP, "reformulate": REFORM, "query": QUERY, "none": OP_NONE, "compare": OP_COMPARE,
             "diff": OP_DIFF, "sum": OP_SUM, "count": OP_COUNT, "count_marks": COUNT_MARKS, "bool": OP_BOOL}


# the words a demonstration uses for an attribute / relation (lab.world's names) and for an entity kind
ATTR_WORDS = {"born": "birth year", "founded": "founding year", "published": "publication year",
              "awards": "number of awards", "employees": "number of employees", "pages": "page count",
              "population": "population", "birthplace": "birthplace", "employer": "employer", "founder": "founder",
              "headquarters": "headquarters", "mayor": "mayor", "author": "author", "publisher": "publisher",
              "role": "profession", "field": "field", "region": "region", "genre": "genre"}
KIND_WORDS = {"person": "person", "org": "company", "place": "town", "work": "book"}


def _attr_word(attr: str) -> str:
    return ATTR_WORDS.get(attr, attr.replace("_", " ").strip())


def _num(v):
    if isinstance(v, bool):
        return None
    if isinstance(v, int):
        return v
    if isinstance(v, str) and re.fullmatch(r"-?\d+", v.strip()):
        return int(v)
    return None


class _Writer:
    """Accumulates the pieces of one demonstration; dataset text (names, values, queries, the answer)
    is recorded as `plain` spans so encode_demo keeps it ordinary text."""

    def __init__(self):
        self.pieces: list[dict] = []
        self.text, self.plain = "", []

    def add(self, *parts: str | tuple[str]):
        for part in parts:
            if isinstance(part, tuple):
                self.plain.append([len(self.text), len(self.text) + len(part[0])])
                part = part[0]
            self.text += part

    def observe(self, obs: str):
        self.pieces.append({"text": self.text, "loss": 1, "plain": self.plain})
        self.pieces.append({"text": obs, "loss": 0})
        self.text, self.plain = "", []

    def close(self) -> list[dict]:
        self.pieces.append({"text": self.text, "loss": 1, "plain": self.plain})
        return self.pieces


class _Plan:
    """One question's gold chain as lookups: per chain entity the (attr, display value) facts it gives."""

    def __init__(self, world, row: dict):
        lab = row["lab"]
        self.row, self.lab = row, lab
        self.chain = [world.entities.get(e) for e in lab["chain"]]
        titles = lab.get("titles") or [e.name for e in self.chain if e]
        if None in self.chain or [e.name for e in self.chain] != list(titles):
            raise ValueError(f"question {row['id']} was made on another world than lab world {world.seed} "
                             f"(its chain {lab['titles'] or lab['chain']}): set world_seed / world_size")
        names = {e.id: e.name for e in world.entities.values()} if hasattr(world, "entities") else {}
        self.facts: dict[str, list[tuple[str, str]]] = {e.id: [] for e in self.chain}
        self.values = []
        for v in lab["values"]:
            shown = names.get(v["value"], v["value"]) if isinstance(v["value"], str) else v["value"]
            self.values.append((v["entity"], v["attr"], shown))
            self.facts.setdefault(v["entity"], []).append((v["attr"], str(shown)))
        # operands: the facts the operation reads (the question's target at each branch's end entity),
        # carried forward to the end; a bridge fact is stated once, when read, then used as the next query
        spec = lab.get("spec") or {}
        ends = set()
        for start in spec.get("starts", ()):
            cur = start
            for r in spec.get("path", ()):
                cur = world.entities[cur].rels[r]
            ends.add(cur)
        self.operand = (lambda eid, a, v: eid in ends and a == spec.get("target")) if ends else \
            (lambda eid, a, v: _num(v) is not None)
        q = normalize_answer(row["question"])
        # a bridge entity needs a fact that names it, read from an earlier chain passage
        for i, e in enumerate(self.chain[1:], 1):
            if f" {normalize_answer(e.name)} " in f" {q} ":
                continue
            if any(val == e.name for prev in self.chain[:i] for _, val in self.facts[prev.id]):
                continue
            for prev in reversed(self.chain[:i]):
                rel = next((r for r, t in prev.rels.items() if t == e.id), None)
                if rel:
                    self.facts[prev.id].append((rel, e.name))
                    break


def _sections(visible: str) -> dict[str, tuple[int, str]]:
    """Title -> (doc number, its text) of the passages visible in an observation."""
    found = list(_DOC.finditer(visible))
    out = {}
    for i, m in enumerate(found):
        end = found[i + 1].start() if i + 1 < len(found) else len(visible)
        # Search-R1 corpus titles may be quoted ('"Name"'): the title is the name either way
        out.setdefault(m.group(2).strip().strip('"'), (int(m.group(1)), visible[m.end():end]))
    return out


def _shows(section: tuple[int, str] | None, facts: list[tuple[str, str]]) -> bool:
    if section is None:
        return False
    text = section[1].lower()
    return all(val.lower() in text for _, val in facts)


def _facts_text(rng: random.Random, known: list[tuple[str, str, str]]) -> list:
    """Known facts as parts (dataset text as 1-tuples), '; '-joined."""
    parts: list = []
    for k, (subject, attr, val) in enumerate(known):
        parts += (["; "] if k else []) + _fill(rng.choice(FACT), {"subject": (subject,), "attr": _attr_word(attr),
                                                                   "value": (val,)})
    return parts


def _fill(tmpl: str, slots: dict) -> list:
    """A template as parts; slot values given as 1-tuples stay dataset text. A name ending in s takes
    a bare apostrophe ("Selass Brothers' founder")."""
    parts: list = []
    for piece in re.split(r"(\{[a-z]+\})", tmpl):
        if re.fullmatch(r"\{[a-z]+\}", piece):
            v = slots[piece[1:-1]]
            parts.extend(v if isinstance(v, list) else [v])
        elif piece:
            if piece.startswith("'s") and parts and isinstance(parts[-1], tuple) and parts[-1][0].endswith("s"):
                piece = "'" + piece[2:]
            parts.append(piece)
    return parts


def _state(rng, known, need_parts) -> list:
    """'<known> <missing>' parts."""
    if known:
        head = _fill(rng.choice(KNOWN), {"facts": _facts_text(rng, known)})
    else:
        head = [rng.choice(NOTHING)]
    return head + [" "] + _fill(rng.choice(MISSING), {"need": need_parts})


def _need(rng, entity, facts) -> list:
    attrs = [a for a, _ in facts]
    if not attrs:
        return _fill(rng.choice(NEED_PASSAGE), {"name": (entity.name,)})
    tmpl = rng.choice(NEED)
    return _fill(tmpl, {"name": (entity.name,), "attr": " and ".join(_attr_word(a) for a in attrs)})


def _query(rng, entity, facts) -> str:
    attr = _attr_word(facts[0][0]) if facts else KIND_WORDS.get(entity.kind, entity.kind)
    return rng.choice(QUERY).format(name=entity.name, attr=attr, kind=KIND_WORDS.get(entity.kind, entity.kind))


def _reformulations(entity, facts, first: str) -> list[str]:
    """The retries after a missed lookup, in order: the name plus the attribute word, plus the kind
    word (a firm named after a surname is found among that surname's people by "company"), the bare
    name; none repeats the first query."""
    attr = _attr_word(facts[0][0]) if facts else KIND_WORDS.get(entity.kind, entity.kind)
    out = []
    for q in (f"{entity.name} {attr}", f"{entity.name} {KIND_WORDS.get(entity.kind, entity.kind)}", entity.name):
        if normalize_answer(q) not in {normalize_answer(x) for x in [first, *out]}:
            out.append(q)
    return out[:MAX_RETRIES]


def _rel(a, b) -> str:
    if isinstance(a, int) and isinstance(b, int):
        return ">" if a > b else "<" if a < b else "="
    return "=" if normalize_answer(str(a)) == normalize_answer(str(b)) else "≠"


def _passes(rel: str, spec: dict) -> bool:
    return rel == {"lt": "<", "gt": ">", "eq": "="}[spec["test"]]


def _operation(rng, lab: dict, values: list, answer: str, names: dict) -> list | None:
    """The final reasoning's operation as parts, worked out from the gold values read on the way (the
    question's program `lab.spec`: target attribute, compare direction, test and threshold); None
    when that work does not give the gold answer."""
    op, spec = lab["op"], lab.get("spec") or {}
    target = spec.get("target")
    # operands: the target values (one per branch), in chain order; without a program, the numbers
    operands = [(names.get(e, e), v) for e, a, v in values if a == target] if target else \
        [(names.get(e, e), _num(v)) for e, _, v in values if _num(v) is not None]
    ans = str(answer)
    if op == "none":
        if operands and normalize_answer(str(operands[-1][1])) != normalize_answer(ans):
            return None
        return _fill(rng.choice(OP_NONE), {"value": (ans,)})
    nums = [n for _, n in operands]
    if op in ("diff", "sum", "compare") and (len(nums) < 2 or any(_num(n) is None for n in nums)):
        return None
    if op == "diff":
        hi, lo = max(nums[:2]), min(nums[:2])
        if _num(ans) != hi - lo:
            return None
        return _fill(rng.choice(OP_DIFF), {"hi": (str(hi),), "lo": (str(lo),), "d": (ans,)})
    if op == "sum":
        if _num(ans) != sum(nums):
            return None
        return _fill(rng.choice(OP_SUM), {"terms": (" + ".join(str(n) for n in nums),), "s": (ans,)})
    if op == "compare":
        (sa, a), (sb, b) = operands[:2]
        pick = (min if spec.get("cmp") == "min" else max)(operands[:2], key=lambda x: x[1])[0] if spec else ans
        if normalize_answer(pick) != normalize_answer(ans):
            return None
        return _fill(rng.choice(OP_COMPARE), {"a": (str(a),), "b": (str(b),), "rel": _rel(a, b), "sa": (sa,),
                                              "sb": (sb,), "answer": (ans,)})
    if op == "bool":
        if not operands or "test" not in spec:
            return None
        v = operands[0][1]
        other = spec["value"] if spec["test"] == "eq" else spec["threshold"]
        rel = _rel(v, other)
        if ("yes" if _passes(rel, spec) else "no") != ans:
            return None
        return _fill(rng.choice(OP_BOOL), {"a": (str(v),), "b": (str(other),), "rel": rel, "answer": (ans,)})
    if op == "count":
        if not operands or "test" not in spec:
            return None
        t = spec.get("threshold", spec.get("value"))
        checks = [(v, _rel(v, t)) for _, v in operands]
        n = sum(_passes(rel, spec) for _, rel in checks)
        if str(n) != ans:
            return None
        marks = rng.choice(COUNT_MARKS)
        items = ", ".join(f"{v} {rel} {t} {marks[_passes(rel, spec)]}" for v, rel in checks)
        return _fill(rng.choice(OP_COUNT), {"items": (items,), "n": (ans,)})
    raise ValueError(f"lab op {op!r}; expected one of {OPS}")


def _learn(d: dict, e) -> None:
    """After reading e's passage: its operand facts join those carried forward; what the next think
    states is the carried operands plus e's other facts (the bridge to the next lookup)."""
    plan = d["plan"]
    read = [(e.name, a, v) for a, v in plan.facts[e.id]]
    d["carry"] += [f for f in read if plan.operand(e.id, f[1], f[2])]
    d["known"] = d["carry"] + [f for f in read if not plan.operand(e.id, f[1], f[2])]


def lab_demos(rows: list[dict], world, tool, tokenizer, max_obs_tokens: int, seed: int = 0,
              protocol: Protocol = QA) -> tuple[list[dict], dict]:
    """Demonstrations of lab question rows over `world`, observations from `tool` (a RetrievalTool over
    the world's corpus). -> (demos, stats): stats count rows, kept, reformulated, and the drops
    (not_retrieved: the chain passage or a gold value not visible after the reformulation;
    op_mismatch: the gold values do not give the gold answer)."""
    stats = {"rows": len(rows), "kept": 0, "reformulated": 0, "not_retrieved": 0, "op_mismatch": 0}
    names = {e.id: e.name for e in world.entities.values()}
    live = []
    for r in rows:
        if "lab" not in r:
            raise ValueError(f"question row {r.get('id')!r} has no 'lab' field (write it with lab.questions)")
        live.append({"row": r, "plan": _Plan(world, r), "rng": random.Random(f"{seed}:{r['id']}"),
                     "w": _Writer(), "known": [], "carry": [], "reform": False})
    hops = max((len(d["plan"].chain) for d in live), default=0)
    for i in range(hops):
        step = [d for d in live if i < len(d["plan"].chain)]
        queries = []
        for d in step:
            e = d["plan"].chain[i]
            facts = d["plan"].facts[e.id]
            rng = d["rng"]
            d["w"].add("<think> ", *_state(rng, d["known"], _need(rng, e, facts)), " ",
                       *_fill(rng.choice(LOOKUP), {"name": (e.name,)}), f" </think>\n{protocol.tool_open} ")
            q = _query(rng, e, facts)
            queries.append(q)
            d["query"] = q
        bodies = tool.batch(queries) if queries else []
        retry = []
        for d, body in zip(step, bodies):
            e = d["plan"].chain[i]
            obs = protocol.render_observation(body)
            visible = tokenizer.decode(observation_ids(tokenizer, protocol, obs, max_obs_tokens),
                                       skip_special_tokens=True)
            d["w"].add((d["query"],), f" {protocol.tool_close}")
            d["w"].observe(obs)
            sec = _sections(visible).get(e.name)
            if _shows(sec, d["plan"].facts[e.id]):
                _learn(d, e)
            else:
                d["retries"] = _reformulations(e, d["plan"].facts[e.id], d["query"])
                retry.append(d)
        for _ in range(MAX_RETRIES):
            if not retry:
                break
            queries = [d["retries"].pop(0) for d in retry]
            missed = []
            for d, q, body in zip(retry, queries, tool.batch(queries)):
                e = d["plan"].chain[i]
                obs = protocol.render_observation(body)
                visible = tokenizer.decode(observation_ids(tokenizer, protocol, obs, max_obs_tokens),
                                           skip_special_tokens=True)
                d["w"].add("<think> ", *_fill(d["rng"].choice(REFORM), {"name": (e.name,)}),
                           f" </think>\n{protocol.tool_open} ", (q,), f" {protocol.tool_close}")
                d["w"].observe(obs)
                d["reform"] = True
                if _shows(_sections(visible).get(e.name), d["plan"].facts[e.id]):
                    _learn(d, e)
                elif d["retries"]:
                    missed.append(d)
                else:
                    stats["not_retrieved"] += 1
                    live.remove(d)
            retry = missed
        for d in retry:
            stats["not_retrieved"] += 1
            live.remove(d)
    demos = []
    for d in live:
        r, plan, rng = d["row"], d["plan"], d["rng"]
        answer = str(plan.lab.get("answer", r["golden_answers"][0]))
        op = _operation(rng, plan.lab, plan.values, answer, names)
        if op is None:
            stats["op_mismatch"] += 1
            continue
        facts = _facts_text(rng, d["carry"] or d["known"])
        d["w"].add("<think> ", *_fill(rng.choice(KNOWN), {"facts": facts}), " ", *op,
                   f" </think>\n{protocol.answer_open} ", (answer,), f" {protocol.answer_close}")
        stats["reformulated"] += d["reform"]
        demos.append({"id": r["id"], "data_source": r.get("data_source", "lab"), "task": "qa",
                      "question": r["question"], "golden_answers": r["golden_answers"], "origin": "lab",
                      "lab": {**plan.lab, "reformulated": d["reform"]},  # the gold chain: role skills
                      "pieces": d["w"].close()})
    stats["kept"] = len(demos)
    if rows and not demos and stats["not_retrieved"] == len(rows):
        log.warning("lab demonstrations: no chain passage retrieved for any of %d questions: does the retriever "
                    "search lab world %d's corpus (retriever.corpus / index_dir)?", len(rows), world.seed)
    return demos, stats


def read_question_rows(path: str) -> list[dict]:
    """Lab question rows (jsonl with a 'lab' field each)."""
    rows = list(read_jsonl(path))
    for k, r in enumerate(rows):
        for field in ("id", "question", "golden_answers", "lab"):
            if field not in r:
                raise ValueError(f"{path}: line {k + 1} has no field {field!r} (not a lab question file)")
    return rows


def lab_source(spec: dict, tool, tokenizer, max_obs_tokens: int, protocol: Protocol = QA,
               base_dir: str | None = None) -> tuple[list[dict], dict]:
    """The `lab` source of `sft.data`: {"builder": "lab", "path": question jsonl (or "n" questions made
    here), "world_seed" (default: read from the question ids "lab{seed}-..."), "world_size" ("default"),
    "hops" / "ops" (keep only these cells: the warm start's low end of the dials), "question_seed",
    "seed" (phrasing RNG), "limit"}. `tool` must search the world's corpus (retriever.corpus)."""
    import os

    from dart_jax.lab.questions import make_questions
    from dart_jax.lab.world import generate_world

    hops = tuple(int(h) for h in spec.get("hops") or (1, 2, 3))
    ops = tuple(spec.get("ops") or OPS)
    rows = None
    if spec.get("path"):
        path = spec["path"]
        if base_dir and not os.path.isabs(path) and not os.path.exists(path):
            path = os.path.join(base_dir, path)
        if not os.path.isfile(path):
            raise FileNotFoundError(f"lab question file {spec['path']} not found")
        rows = [r for r in read_question_rows(path) if r["lab"]["hops"] in hops and r["lab"]["op"] in ops]
    world_seed = spec.get("world_seed")
    if world_seed is None:
        m = re.match(r"lab(\d+)-", str(rows[0]["id"])) if rows else None
        if m is None:
            raise ValueError("sft.data lab source: set world_seed (no question ids of the form lab{seed}-...)")
        world_seed = int(m.group(1))
    world = generate_world(int(world_seed), spec.get("world_size", "default"))
    if rows is None:
        if not spec.get("n"):
            raise ValueError("sft.data lab source: set path (a question file) or n (questions to make)")
        rows = make_questions(world, int(spec["n"]), hops, ops, int(spec.get("question_seed", 0)))
    if spec.get("limit"):
        rows = rows[:int(spec["limit"])]
    return lab_demos(rows, world, tool, tokenizer, max_obs_tokens, int(spec.get("seed", 0)), protocol)
