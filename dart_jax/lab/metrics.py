"""Role skill metrics of lab trajectories and the degeneracy gate: whether the agent *uses the tool*
(its queries find the gold chain's passages, not the question copied) and *reasons* (answers right once the
whole chain is retrieved, states the gold intermediate values), measured apart, per step and per evaluation.

A trajectory is read from any of the forms a run writes (`trajectory`):
  - evaluation records (eval.runner `_record`): "id", "tool_calls" [{query, observation}], "response"
    (observations included), "answer";
  - training records (run.records `append_rollouts`, rollouts.jsonl): "uid", "pieces" [{text, loss}]: loss 1
    the model's text, loss 0 what was inserted (a tool observation "<information>…</information>" or the
    invalid-action message);
  - a batch in memory (`batch_records`): "turns" [{action, query, observation}], "reward_text";
  - a bare "response" text (analysis dumps): calls parsed from "<search>q</search> <information>…".
The question rows are the lab's (lab.questions): "lab": {hops, op, chain, titles, values, answer}.

Rules (all text compared after SQuAD normalisation, data.text.normalize_answer):
  retrieved titles  the "Doc k(Title: NAME)" titles of a call's observation (tools.retrieval.format_passages).
  copy              a query whose normalised text equals the question's, or whose token sets have Jaccard
                    overlap |Q ∩ U| / |Q ∪ U| ≥ 0.9 (one word added to or dropped from a 10-word question).
  tool skill        share of tool calls (pooled) that are not a copy and retrieve a chain title that no
                    earlier call of the trajectory retrieved (copies still count as having retrieved).
  chain coverage    share of trajectories whose calls retrieved every chain title.
  reasoning skill   EM (rewards.qa.em on the answer, against the row's golden answers) among the trajectories
                    that covered the chain.
  values stated     share of gold intermediate values ("lab"."values") whose normalised text occurs as whole
                    words in the trajectory's normalised <think> spans (pooled over values); `reasoning_values`:
                    the same among chain-covering trajectories.
  distinct think    distinct normalised <think> spans over all trajectories, and the share of the commonest.

`surface_metrics` needs no lab row: what any QA or SQL trajectory shows on its surface (question copies, the
commonest tool-call shape, template <think> spans), under the same names, so `degeneracy_gate` judges any
setting a study samples (SQL calls are read from <sql>…</sql> <observation>…</observation> as well).
  call shape        a text query: its normalised text; a SQL call (SELECT / WITH / PRAGMA …): its tokens with
                    every identifier (a word not an SQL keyword, a quoted name) replaced by `id` and every literal
                    (string, number) by `?` — `SELECT * FROM schools LIMIT 3` and `select * from frpm limit 5`
                    are one shape, "select * from id limit ?".
  top call share    share of all tool calls that are the commonest call shape."""

from __future__ import annotations

import collections
import logging
import math
import re

from dart_jax.data.text import normalize_answer
from dart_jax.errors import UserError
from dart_jax.rewards.qa import em, extract_answer

log = logging.getLogger(__name__)

COPY_OVERLAP = 0.9  # token-set Jaccard overlap at or above which a query is a copy of the question
PREFIX = "lab/"

_THINK = re.compile(r"<think>(.*?)</think>", re.DOTALL)
_INFO_BLOCK = re.compile(r"<(information|observation)>.*?(?:</\1>|\Z)", re.DOTALL)
_CALL = re.compile(r"<search>((?:(?!<search>).)*?)</search>\s*<information>(.*?)(?:</information>|\Z)", re.DOTALL)
_SQL_CALL = re.compile(r"<sql>((?:(?!<sql>).)*?)</sql>\s*<observation>(.*?)(?:</observation>|\Z)", re.DOTALL)
_OBS_OPEN = ("<information>", "<observation>")
_SQL_START = re.compile(r"\s*(select|with|pragma|explain)\b", re.IGNORECASE)
_SQL_TOKEN = re.compile(r"'(?:[^']|'')*'|\"(?:[^\"]|\"\")*\"|`[^`]*`|\[[^\]]*\]|\d+(?:\.\d+)?|\w+|[^\s\w]")
_SQL_WORDS = frozenset("""select from where and or not in is null like glob between join inner left right outer cross
natural on using as group by order having limit offset distinct all union intersect except case when then else end
asc desc count sum avg min max total cast exists with recursive pragma table_info explain values collate escape
iif coalesce ifnull nullif substr substring instr length lower upper trim round abs strftime date time datetime
julianday real integer text""".split())
# a passage's title: quoted (Search-R1 corpora and the lab's: contents start '"NAME"\n') or up to the first ')'
_TITLE = re.compile(r'(?:^|\n)Doc \d+\(Title: ("[^"\n]*"(?=\))|[^\n]*?)\)')


def titles(observation: str | None) -> list[str]:
    """The normalised passage titles of one rendered observation, in order."""
    return [normalize_answer(t.strip().strip('"')) for t in _TITLE.findall(observation or "")]


def is_copy(query: str, question: str) -> bool:
    """A query that is the question: equal after normalisation, or token-set Jaccard overlap ≥ COPY_OVERLAP."""
    q, u = normalize_answer(query or ""), normalize_answer(question or "")
    if q == u:
        return True
    a, b = set(q.split()), set(u.split())
    return bool(a | b) and len(a & b) / len(a | b) >= COPY_OVERLAP


def _calls_from_pieces(pieces: list[dict]) -> tuple[list[tuple[str, str]], str]:
    """(query, observation body) per tool call of a training record, and the model's own text."""
    calls, written, since = [], [], ""
    for p in pieces:
        text = p.get("text", "")
        if p.get("loss"):
            written.append(text)
            since += text
            continue
        tag = next((t for t in _OBS_OPEN if t in text), None)
        if tag:
            opener = "<search>" if tag == "<information>" else "<sql>"
            at = since.rfind(opener)
            query = since[at + len(opener):].split("</" + opener[1:])[0].strip() if at >= 0 else ""
            body = text.split(tag, 1)[1].split("</" + tag[1:])[0]
            calls.append((query, body))
        since = ""
    return calls, "\n".join(written)


def trajectory(rec: dict) -> dict:
    """One record in any recorded form -> {"id", "question", "calls": [(query, observation)], "think": [spans],
    "answer": str | None}. A record without any of the forms has no calls and no text."""
    if "pieces" in rec:
        calls, text = _calls_from_pieces(rec["pieces"])
    else:
        response = rec.get("response") or ""
        text = rec.get("reward_text") or _INFO_BLOCK.sub("", response)
        if "tool_calls" in rec:  # (an evaluation record's "turns" is their count)
            calls = [(c.get("query") or "", c.get("observation") or "") for c in rec["tool_calls"]]
        elif isinstance(rec.get("turns"), list):
            calls = [(t.get("query") or "", t.get("observation") or "") for t in rec["turns"]
                     if t.get("action") == "tool"]
        else:
            calls = [(q.strip(), o) for q, o in _CALL.findall(response) + _SQL_CALL.findall(response)]
    answer = rec["answer"] if "answer" in rec else extract_answer(text)
    return {"id": rec.get("id", rec.get("uid")), "question": rec.get("question"), "calls": calls,
            "think": [s.strip() for s in _THINK.findall(text)], "answer": answer}


def _stated(value, think_norm: str) -> bool:
    v = normalize_answer(str(value))
    return bool(v) and f" {v} " in f" {think_norm} "


def trajectory_skills(rec: dict, row: dict) -> dict:
    """The role skills of one trajectory against its lab question row (counts, so they pool)."""
    t, lab = trajectory(rec), row["lab"]
    question = t["question"] or row["question"]
    chain = {normalize_answer(x) for x in lab["titles"]}
    seen: set[str] = set()
    useful = copies = 0
    for query, obs in t["calls"]:
        got = chain & set(titles(obs))
        copy = is_copy(query, question)
        copies += copy
        useful += bool(got - seen) and not copy
        seen |= got
    think_norm = normalize_answer(" ".join(t["think"]))
    values = lab.get("values", [])
    return {"id": t["id"], "calls": len(t["calls"]), "useful": useful, "copies": copies,
            "covered": bool(chain) and chain <= seen, "chain_recall": len(seen) / len(chain) if chain else float("nan"),
            "correct": em(t["answer"], row["golden_answers"]), "values": len(values),
            "stated": sum(_stated(v["value"], think_norm) for v in values), "think": t["think"]}


def _ratio(a: float, b: float) -> float:
    return a / b if b else float("nan")


def _rows(questions) -> dict:
    """id -> lab row; a lab row without what the metrics read is a one-line UserError."""
    rows = questions.values() if isinstance(questions, dict) else questions
    out = {}
    for r in rows:
        if not (isinstance(r, dict) and r.get("lab")):
            continue
        lab = r["lab"]
        if not (isinstance(lab, dict) and all(k in lab for k in ("hops", "op", "titles"))
                and isinstance(lab["titles"], list) and isinstance(lab.get("values", []), list)
                and all(isinstance(v, dict) and "value" in v for v in lab.get("values", []))
                and isinstance(r.get("golden_answers"), list)):
            raise UserError(f"question {r.get('id')!r}: its lab row needs golden_answers and lab.hops, lab.op, "
                            "lab.titles (a list) and lab.values (a list of "
                            "{entity, attr, value})")
        out[r["id"]] = r
    return out


def _aggregate(skills: list[dict], prefix: str) -> dict:
    n = len(skills)
    calls = sum(s["calls"] for s in skills)
    covered = [s for s in skills if s["covered"]]
    m = {"trajectories": n, "accuracy": _ratio(sum(s["correct"] for s in skills), n),
         "tool_calls": _ratio(calls, n), "tool_skill": _ratio(sum(s["useful"] for s in skills), calls),
         "copy_rate": _ratio(sum(s["copies"] for s in skills), calls),
         "chain_coverage": _ratio(len(covered), n),
         "chain_recall": _ratio(sum(s["chain_recall"] for s in skills), n),
         "reasoning_skill": _ratio(sum(s["correct"] for s in covered), len(covered)),
         "values_stated": _ratio(sum(s["stated"] for s in skills), sum(s["values"] for s in skills)),
         "reasoning_values": _ratio(sum(s["stated"] for s in covered), sum(s["values"] for s in covered)),
         **_spread((x for s in skills for x in s["think"]), "think")}
    return {prefix + k: float(v) for k, v in m.items()}


def _spread(items, name: str) -> dict:
    """{name}_spans (or {name}s), distinct_{name}, top_{name}_share of some strings (already normalised or
    normalised here when they are <think> spans)."""
    counts = collections.Counter(normalize_answer(x) if name == "think" else x for x in items)
    total = sum(counts.values())
    top = _ratio(counts.most_common(1)[0][1], total) if total else float("nan")
    return {f"{name}_spans" if name == "think" else f"{name}s": total, f"distinct_{name}": len(counts),
            f"top_{name}_share": top}


def call_shape(query: str) -> str:
    """A tool call's shape (module docstring): a SQL call with its identifiers and literals replaced, any other
    query its normalised text."""
    if not _SQL_START.match(query or ""):
        return normalize_answer(query or "")
    out = []
    for tok in _SQL_TOKEN.findall(query):
        low = tok.lower()
        if tok[0] in "'" or tok[0].isdigit():
            out.append("?")
        elif tok[0] in '"`[' or (tok[0].isalnum() or tok[0] == "_") and low not in _SQL_WORDS:
            out.append("id")
        else:
            out.append(low)
    return " ".join(out)


def surface_metrics(records: list[dict], questions=None, prefix: str = PREFIX) -> dict:
    """What any QA or SQL trajectory shows without a lab row (module docstring), under the names
    `degeneracy_gate` reads: "lab/trajectories", "lab/tool_calls" (per trajectory), "lab/copy_rate" (tool calls
    that copy their question, among those whose question is known: the record's "question" or its row's in
    `questions`, rows or id -> row), "lab/distinct_calls" (distinct normalised calls), "lab/top_call_share",
    "lab/think_spans", "lab/distinct_think", "lab/top_think_share", "lab/not_run" (refused prompts). NaN where
    nothing is measured."""
    rows = questions if isinstance(questions, dict) else {r["id"]: r for r in questions or ()}
    ran = [r for r in records if r.get("finish") != "overlong"]
    calls, copies, asked, spans = [], 0, 0, []
    for rec in ran:
        t = trajectory(rec)
        question = t["question"] or (rows.get(t["id"]) or {}).get("question")
        for query, _ in t["calls"]:
            calls.append(query or "")
            if question:
                asked += 1
                copies += is_copy(query, question)
        spans += t["think"]
    shapes = _spread((call_shape(q) for q in calls), "call")
    m = {"trajectories": len(ran), "tool_calls": _ratio(len(calls), len(ran)), "copy_rate": _ratio(copies, asked),
         "distinct_calls": len({normalize_answer(q) for q in calls}), "top_call_share": shapes["top_call_share"],
         **_spread(spans, "think"), "not_run": len(records) - len(ran)}
    return {prefix + k: float(v) for k, v in m.items()}


def _matched(records: list[dict], questions) -> tuple[list[tuple[dict, dict]], int, int]:
    """(record, lab row) pairs of the trajectories that ran; how many have no lab row; how many did not run (a
    prompt the context rule refused: finish "overlong", no response)."""
    rows = _rows(questions)
    ran = [r for r in records if r.get("finish") != "overlong"]
    pairs = [(r, rows.get(r.get("id", r.get("uid")))) for r in ran]
    return [(r, q) for r, q in pairs if q is not None], sum(q is None for _, q in pairs), len(records) - len(ran)


def role_skills(records: list[dict], questions, prefix: str = PREFIX) -> dict:
    """Flat float metrics over the trajectories that ran whose question is a lab row (metrics.jsonl names
    "lab/tool_skill", ...; NaN where nothing is measured); the others counted: "lab/unmatched" (no lab row),
    "lab/not_run" (refused prompts)."""
    pairs, unmatched, not_run = _matched(records, questions)
    m = _aggregate([trajectory_skills(r, q) for r, q in pairs], prefix)
    m[prefix + "unmatched"], m[prefix + "not_run"] = float(unmatched), float(not_run)
    return m


def per_cell(records: list[dict], questions, prefix: str = PREFIX) -> dict:
    """(hops, op) -> the `role_skills` metrics of that cell's trajectories, cells in sorted order."""
    cells: dict = collections.defaultdict(list)
    for r, q in _matched(records, questions)[0]:
        cells[(int(q["lab"]["hops"]), str(q["lab"]["op"]))].append(trajectory_skills(r, q))
    return {k: _aggregate(cells[k], prefix) for k in sorted(cells)}


def cell_metrics(cells: dict, prefix: str = PREFIX) -> dict:
    """`per_cell`'s result flattened for metrics.jsonl: "lab/h2_compare/tool_skill", ..."""
    return {f"{prefix}h{h}_{op}/{k[len(prefix):]}": v for (h, op), m in cells.items() for k, v in m.items()}


def degeneracy_gate(metrics: dict, max_copy: float = 0.10, min_distinct: int = 10, max_top_share: float = 0.5,
                    max_top_call: float = 0.5, prefix: str = PREFIX) -> list[str]:
    """Why a setting measures a template rather than skills (empty: none found), from `role_skills` or
    `surface_metrics`: question-copy rate > `max_copy`; no <think> span; fewer than `min_distinct` distinct
    <think> spans, or the commonest > `max_top_share` of them; the commonest tool-call shape > `max_top_call`
    of the calls (read when the metrics have "top_call_share": `SELECT * FROM <table> LIMIT 3` for every call
    is 1.0; a varied agent's commonest shape is a small share). The reasoning and call-shape rules are judged
    once there are at least `min_distinct` spans / calls (a smaller sample cannot tell)."""
    def get(k):
        v = metrics.get(prefix + k)
        return float("nan") if v is None else float(v)
    n, copy, spans = get("trajectories"), get("copy_rate"), get("think_spans")
    if not n > 0:
        return [f"no lab trajectories were measured ({prefix}trajectories missing or 0)"]
    reasons = []
    if copy > max_copy:
        reasons.append(f"question-copy rate {copy:.3f} > {max_copy:.2f}: the queries are the question")
    if not spans > 0:
        reasons.append(f"no <think> span in {n:.0f} trajectories")
    elif spans >= min_distinct:
        if get("distinct_think") < min_distinct:
            reasons.append(f"only {get('distinct_think'):.0f} distinct <think> spans among {spans:.0f} "
                           f"(< {min_distinct}): template reasoning")
        if get("top_think_share") > max_top_share:
            reasons.append(f"the commonest <think> span is {get('top_think_share'):.1%} of {spans:.0f} "
                           f"(> {max_top_share:.0%}): template reasoning")
    n_calls, top_call = get("tool_calls") * n, get("top_call_share")
    if n_calls >= min_distinct and top_call > max_top_call:
        reasons.append(f"the commonest tool-call shape is {top_call:.1%} of {n_calls:.0f} calls "
                       f"(> {max_top_call:.0%}): template tool use")
    return reasons


def check_gate(metrics: dict, strict: bool, **gate) -> list[str]:
    """`degeneracy_gate` for a study command: strict -> UserError listing the reasons; else a loud warning.
    -> the reasons."""
    reasons = degeneracy_gate(metrics, **gate)
    if reasons:
        msg = "degeneracy gate: " + "; ".join(reasons)
        if strict:
            raise UserError(msg + " (the setting measures no role skill; fix the warm start / retriever, or run "
                                  "non-strict to only flag it)")
        log.warning("!!! %s !!! (results of this setting measure no role skill)", msg)
    return reasons


def batch_records(tb, questions) -> list[dict]:
    """A rollout batch in memory (rollout.trajectory.TrajectoryBatch) as records `role_skills` reads, each
    trajectory's question row found by its uid in `questions` (rows or id -> row): a trainer's per-step hook
    that needs no rollouts.jsonl."""
    rows = questions if isinstance(questions, dict) else {r["id"]: r for r in questions}
    return [{"id": u, "question": rows.get(u, {}).get("question"), "turns": tb.turns[i],
             "reward_text": tb.reward_text[i], "finish": tb.finish_reason[i]} for i, u in enumerate(tb.uids)]


def finite(metrics: dict) -> dict:
    """The metrics that are numbers (NaN dropped), for writers that refuse NaN."""
    return {k: v for k, v in metrics.items() if not (isinstance(v, float) and math.isnan(v))}
