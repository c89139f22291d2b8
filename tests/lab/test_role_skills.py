"""Role skill metrics and the degeneracy gate (lab.metrics) on hand-made lab trajectories, every figure worked
by hand in the comments, and on real evaluation records shipped under docs/results/data; the surface metrics
(no lab row) on hand-made QA and SQL trajectories: a template flags, a varied setting passes."""

import gzip
import json
import logging
import os

import pytest

from dart_jax.errors import UserError
from dart_jax.lab.metrics import (
    batch_records,
    call_shape,
    cell_metrics,
    check_gate,
    degeneracy_gate,
    is_copy,
    per_cell,
    role_skills,
    surface_metrics,
    titles,
    trajectory,
    trajectory_skills,
)
from dart_jax.tools.retrieval import format_passages

ROOT = os.path.normpath(os.path.join(os.path.dirname(__file__), "..", ".."))

# a tiny world in the lab corpus format: contents '"NAME"\npassage'
P1 = {"contents": '"Ilvar Branoth"\nIlvar Branoth works for Quenta Loridge Works. He was born in 1941.'}
P2 = {"contents": '"Quenta Loridge Works"\nQuenta Loridge Works was founded in 1873 in Osmere.'}
P3 = {"contents": '"Ilvar Tessane"\nIlvar Tessane is a painter who once met Ilvar Branoth.'}
Q1 = {"id": "lab1-q000001", "question": "In which year was the employer of Ilvar Branoth founded?",
      "golden_answers": ["1873"], "data_source": "lab",
      "lab": {"hops": 2, "op": "none", "chain": ["person-0001", "org-0002"],
              "titles": ["Ilvar Branoth", "Quenta Loridge Works"],
              "values": [{"entity": "org-0002", "attr": "founded", "value": 1873}], "answer": "1873"}}
Q2 = {"id": "lab1-q000002", "question": "When was Ilvar Branoth born?", "golden_answers": ["1941"],
      "data_source": "lab", "lab": {"hops": 1, "op": "none", "chain": ["person-0001"], "titles": ["Ilvar Branoth"],
                                    "values": [{"entity": "person-0001", "attr": "born", "value": 1941}],
                                    "answer": "1941"}}


def forms(row: dict, steps: list[tuple]) -> dict:
    """One trajectory (steps: ("think", s) | ("search", q, docs) | ("answer", a)) in each recorded form."""
    pieces, written, turns, calls = [], "", [], []
    for st in steps:
        if st[0] == "think":
            written += f"<think> {st[1]} </think>\n"
        elif st[0] == "search":
            body = format_passages(st[2])
            pieces += [{"text": written + f"<search> {st[1]} </search>", "loss": 1},
                       {"text": f"\n\n<information>{body}</information>\n\n", "loss": 0}]
            written = ""
            turns.append({"action": "tool", "query": st[1], "observation": body, "tokens": 9})
            calls.append({"query": st[1], "observation": body})
        else:
            written += f"<answer> {st[1]} </answer>"
            turns.append({"action": "answer", "query": None, "observation": None, "tokens": 5})
    pieces.append({"text": written, "loss": 1})
    response = "".join(p["text"] for p in pieces)
    reward_text = "".join(p["text"] if p["loss"] else "\n\n<information></information>\n\n" for p in pieces)
    answer = next((st[1] for st in steps if st[0] == "answer"), None)
    base = {"question": row["question"], "golden_answers": row["golden_answers"]}
    return {"eval": dict(base, id=row["id"], sample=0, answer=answer, tool_calls=calls, response=response),
            "rollouts": dict(base, step=1, uid=row["id"], task="qa", pieces=pieces, score=0.0, finish="answer"),
            "memory": {"id": row["id"], "question": row["question"], "turns": turns, "reward_text": reward_text},
            "response": {"uid": row["id"], "response": response}}


LOOK = ("think", "I need to look this up.")
# T1 searches the question verbatim (retrieves Ilvar Branoth, but a copy: not useful), answers wrong
T1 = [LOOK, ("search", Q1["question"], [P1, P3]), ("answer", "1941")]
# T2 names the bridge entity: 2 useful calls, whole chain, right, states 1873 in its reasoning
T2 = [("think", "Ilvar Branoth works for an organisation I do not know yet."), ("search", "Ilvar Branoth", [P1, P3]),
      ("think", "His employer is Quenta Loridge Works; I need its founding year."),
      ("search", "Quenta Loridge Works", [P2]), ("think", "It was founded in 1873."), ("answer", "1873")]
# T3 retrieves Ilvar Branoth twice: the second call brings no new chain passage (1 useful of 2), no coverage
T3 = [LOOK, ("search", "Ilvar Branoth", [P1]), ("search", "Ilvar Branoth employer", [P1, P3]), ("answer", "1941")]
# T4 covers the chain (2 useful calls) but reasons wrong: answers 1874 and states 1874, not 1873
T4 = [("think", "I need the employer of Ilvar Branoth."), ("search", "Ilvar Branoth", [P1]),
      ("search", "Quenta Loridge Works", [P2]), ("think", "Founded in 1874."), ("answer", "1874")]


def test_titles_and_copy_rule():
    assert titles(format_passages([P1, P3])) == ["ilvar branoth", "ilvar tessane"]
    # Search-R1 corpora quote titles, which may hold parentheses
    assert titles('Doc 1(Title: "Real Chance of Love (season 2)") Real Chance ...\nDoc 2(Title: Foo) bar\n') == \
        ["real chance of love season 2", "foo"]
    q = "who played billy beane the lead role in the 2011 film moneyball"  # 10 distinct tokens without a/an/the
    assert is_copy("Who played Billy Beane, the lead role in the 2011 film (Moneyball)?", q)  # equal normalised
    assert is_copy(q + " cast", q)  # one word added: Jaccard 10/11 = 0.909 >= 0.9
    assert is_copy("who played billy beane lead role in 2011 film", q)  # one word dropped: 9/10 = 0.9
    assert is_copy("who who played billy beane the lead role in the 2011 film moneyball", q)  # same token set
    assert not is_copy("played billy beane lead role in 2011", q)  # three words dropped: 7/10 = 0.7
    assert not is_copy("Ilvar Branoth", Q1["question"])


@pytest.mark.parametrize("form", ["eval", "rollouts", "memory", "response"])
def test_every_recorded_form_reads_the_same(form):
    """T2 in each form a run writes: the same calls, <think> spans and answer."""
    t = trajectory(forms(Q1, T2)[form])
    assert t["id"] == Q1["id"]
    assert [q for q, _ in t["calls"]] == ["Ilvar Branoth", "Quenta Loridge Works"]
    assert [titles(o) for _, o in t["calls"]] == [["ilvar branoth", "ilvar tessane"], ["quenta loridge works"]]
    assert t["think"] == [T2[0][1], T2[2][1], T2[4][1]]
    assert t["answer"] == "1873"
    s = trajectory_skills(forms(Q1, T2)[form], Q1)
    assert (s["calls"], s["useful"], s["copies"], s["covered"], s["correct"], s["stated"]) == (2, 2, 0, True, 1.0, 1)


def test_per_trajectory_skills():
    got = [trajectory_skills(forms(Q1, t)["eval"], Q1) for t in (T1, T2, T3, T4)]
    keys = ("calls", "useful", "copies", "covered", "chain_recall", "correct", "stated")
    assert [tuple(s[k] for k in keys) for s in got] == [
        (1, 0, 1, False, 0.5, 0.0, 0),  # copy: retrieves Ilvar Branoth but is not useful
        (2, 2, 0, True, 1.0, 1.0, 1),
        (2, 1, 0, False, 0.5, 0.0, 0),  # the second call re-retrieves Ilvar Branoth
        (2, 2, 0, True, 1.0, 0.0, 0)]   # covers the chain, answers 1874


def test_role_skills_worked_by_hand():
    recs = [forms(Q1, t)["eval"] for t in (T1, T2, T3, T4)] + [{"id": "nq-1", "question": "x", "tool_calls": []}]
    m = role_skills(recs, [Q1, Q2])
    want = {"lab/trajectories": 4, "lab/unmatched": 1,     # the NQ record has no lab row
            "lab/not_run": 0,
            "lab/tool_calls": 7 / 4,                       # 1 + 2 + 2 + 2 calls
            "lab/tool_skill": 5 / 7,                       # useful 0 + 2 + 1 + 2
            "lab/copy_rate": 1 / 7,                        # T1's call
            "lab/chain_coverage": 2 / 4,                   # T2, T4
            "lab/chain_recall": (0.5 + 1 + 0.5 + 1) / 4,
            "lab/accuracy": 1 / 4,                         # T2
            "lab/reasoning_skill": 1 / 2,                  # T2 right, T4 wrong among the covering
            "lab/values_stated": 1 / 4,                    # 1873 stated by T2 only, one value each
            "lab/reasoning_values": 1 / 2,
            "lab/think_spans": 7,                          # 1 + 3 + 1 + 2
            "lab/distinct_think": 6,                       # "I need to look this up." twice
            "lab/top_think_share": 2 / 7}
    assert set(m) == set(want)
    for k, v in want.items():
        assert m[k] == pytest.approx(v, abs=1e-12), k
    # the rollouts.jsonl form of the same trajectories gives the same figures
    m2 = role_skills([forms(Q1, t)["rollouts"] for t in (T1, T2, T3, T4)], {Q1["id"]: Q1})
    assert all(m2[k] == pytest.approx(v, abs=1e-12) for k, v in want.items() if k != "lab/unmatched")
    # the gate: copy 1/7 = 0.143 > 0.10; 7 spans < min_distinct 10, so the reasoning rules are not judged
    reasons = degeneracy_gate(m)
    assert len(reasons) == 1 and "question-copy rate 0.143 > 0.10" in reasons[0]
    assert degeneracy_gate(m, max_copy=0.15) == []
    with pytest.raises(UserError, match="'lab1-q000001': its lab row needs"):
        role_skills(recs, [dict(Q1, lab={"hops": 2, "op": "none"})])


def test_per_cell():
    born = [LOOK, ("search", "Ilvar Branoth", [P1, P3]), ("think", "Born in 1941."), ("answer", "1941")]
    recs = [forms(Q1, t)["eval"] for t in (T2, T4)] + [forms(Q2, born)["eval"]]
    cells = per_cell(recs, [Q1, Q2])
    assert list(cells) == [(1, "none"), (2, "none")]
    assert cells[(1, "none")]["lab/trajectories"] == 1 and cells[(1, "none")]["lab/reasoning_skill"] == 1.0
    assert cells[(1, "none")]["lab/values_stated"] == 1.0  # "Born in 1941." states 1941
    assert cells[(2, "none")]["lab/trajectories"] == 2 and cells[(2, "none")]["lab/reasoning_skill"] == 0.5
    flat = cell_metrics(cells)
    assert flat["lab/h2_none/tool_skill"] == 1.0 and flat["lab/h1_none/copy_rate"] == 0.0


def _named(k: int, think: str) -> dict:
    return forms(Q1, [("think", think), ("search", "Quenta Loridge Works", [P2]), ("answer", "1873")])["eval"]


def test_gate_fires_on_template_reasoning_and_passes_varied(caplog):
    template = role_skills([_named(k, "I need to look this up.") for k in range(20)], [Q1])
    # copy 0; 20 spans, 1 distinct (< 10) and the commonest is 100% (> 50%)
    assert template["lab/copy_rate"] == 0.0 and template["lab/distinct_think"] == 1
    reasons = degeneracy_gate(template)
    assert len(reasons) == 2 and "only 1 distinct <think> spans among 20" in reasons[0] and "100.0%" in reasons[1]
    with pytest.raises(UserError, match="degeneracy gate: only 1 distinct"):
        check_gate(template, strict=True)
    with caplog.at_level(logging.WARNING, logger="dart_jax.lab.metrics"):
        assert check_gate(template, strict=False) == reasons
    assert "degeneracy gate" in caplog.text
    varied = role_skills([_named(k, f"Quenta Loridge Works is the employer; step {k} of the lookup.")
                          for k in range(20)], [Q1])
    assert varied["lab/distinct_think"] == 20 and varied["lab/top_think_share"] == 0.05
    assert degeneracy_gate(varied) == [] and check_gate(varied, strict=True) == []
    assert degeneracy_gate(role_skills([], [Q1]))[0].startswith("no lab trajectories")
    no_think = role_skills([forms(Q1, [("search", "Ilvar Branoth", [P1]), ("answer", "x")])["eval"]], [Q1])
    assert degeneracy_gate(no_think) == ["no <think> span in 1 trajectories"]


def test_batch_records_reads_a_trajectory_batch():
    mem = [forms(Q1, t)["memory"] for t in (T2, T3)]

    class Batch:  # the attributes of rollout.trajectory.TrajectoryBatch that batch_records reads
        uids = [Q1["id"], Q1["id"], Q1["id"]]
        turns = [r["turns"] for r in mem] + [[]]
        reward_text = [r["reward_text"] for r in mem] + [""]
        finish_reason = ["answer", "answer", "overlong"]  # a refused prompt's stand-in: not counted
    m = role_skills(batch_records(Batch, [Q1, Q2]), {Q1["id"]: Q1})
    assert m["lab/trajectories"] == 2 and m["lab/not_run"] == 1
    assert m["lab/tool_skill"] == 3 / 4 and m["lab/chain_coverage"] == 0.5  # T2: 2 of 2 useful, T3: 1 of 2


def test_real_evaluation_records():
    """Shipped NQ evaluation records (eval.runner `_record` form) with a hand-made lab row for the first
    question: the warm start searched the question verbatim, got the gold passage as Doc 1, answered wrong."""
    path = os.path.join(ROOT, "docs/results/data/methods_smollm2/archive/eval/dart_s0/per_question.jsonl.gz")
    with gzip.open(path, "rt") as f:
        recs = [json.loads(line) for line in f]
    first = recs[0]
    assert first["id"] == "nq-oracle-2294" and first["answer"] == "Billy Beane"
    row = {"id": first["id"], "question": first["question"], "golden_answers": first["golden_answers"],
           "lab": {"hops": 1, "op": "none", "chain": ["e1"], "titles": ["Kerris Dorsey"],
                   "values": [{"entity": "e1", "attr": "name", "value": "Kerris Lilla Dorsey"}],
                   "answer": "Kerris Lilla Dorsey"}}
    s = trajectory_skills(first, row)
    assert (s["calls"], s["useful"], s["copies"], s["covered"], s["correct"], s["stated"]) == (1, 0, 1, True, 0.0, 0)
    assert s["think"] == ["I need to look this up."]
    m = role_skills(recs[:5], [row])
    assert m["lab/trajectories"] == 1 and m["lab/unmatched"] == 4 and m["lab/copy_rate"] == 1.0
    assert m["lab/tool_skill"] == 0.0 and m["lab/reasoning_skill"] == 0.0 and m["lab/reasoning_values"] == 0.0
    # the text parser (bare responses) finds the queries and passage titles the records list, on all 128 records
    # (127 calls; 6 bodies differ only where the response holds the observation cut to its token cap)
    assert len(recs) == 128 and sum(len(r["tool_calls"]) for r in recs) == 127
    for rec in recs:
        t = trajectory({"id": rec["id"], "response": rec["response"]})
        assert [(q, titles(o)) for q, o in t["calls"]] == \
            [(c["query"], titles(c["observation"])) for c in rec["tool_calls"]], rec["id"]
        assert t["answer"] == rec["answer"]


def test_gate_fires_on_the_shipped_nq_trajectories():
    """The template agent of the shipped NQ runs, each question given a lab row (no chain passage can match):
    greedy evaluation records (eval form) and sampled training responses (bare-response form)."""
    data = os.path.join(ROOT, "docs/results/data")
    with gzip.open(os.path.join(data, "methods_smollm2/archive/eval/dart_s0/per_question.jsonl.gz"), "rt") as f:
        ev = [json.loads(line) for line in f]
    with gzip.open(os.path.join(data, "grad_angles_smollm2/rollouts/responses_chunk_005-009.jsonl.gz"), "rt") as f:
        tr = [json.loads(line) for line in f]
    rows = [{"id": r["id"], "question": r["question"], "golden_answers": r["golden_answers"],
             "lab": {"hops": 1, "op": "none", "chain": ["x"], "titles": ["Nobody Anywhere"], "values": []}} for r in ev]
    m = role_skills(ev, rows)
    # 127 calls, 97 copies (0.764); every one of the 128 <think> spans is "I need to look this up."
    assert m["lab/copy_rate"] == pytest.approx(97 / 127) and m["lab/distinct_think"] == 1
    assert [r.split(" ")[0] for r in degeneracy_gate(m)] == ["question-copy", "only", "the"]
    m = role_skills(tr, rows)  # 384 of its 640 responses are of these questions (T = 1)
    assert m["lab/trajectories"] == 384 and m["lab/copy_rate"] == pytest.approx(0.8495, abs=1e-4)
    assert m["lab/distinct_think"] == 9 and m["lab/think_spans"] == 749
    assert len(degeneracy_gate(m)) == 3  # copy 0.85, 9 distinct < 10, commonest 50.9% > 50%


# --- surface metrics: any QA or SQL trajectory, no lab row ------------------------------------------------------

# 20 ids: 5 questions, 4 times each
QUESTIONS = [{"id": f"nq-{k}", "question": q} for k, q in enumerate(
    ["who wrote the novel moby dick", "when did the berlin wall fall", "what is the capital of australia",
     "who painted the mona lisa", "how many moons does mars have"] * 4)]
DOC = "Doc 1(Title: Somebody) a passage"


def _qa(row: dict, think: str, query: str) -> dict:
    return {"id": row["id"], "question": row["question"], "tool_calls": [{"query": query, "observation": DOC}],
            "response": f"<think> {think} </think>\n<search> {query} </search>\n\n<information>{DOC}</information>"
                        "\n\n<answer> x </answer>", "answer": "x", "finish": "answer"}


def test_surface_metrics_flag_a_template_qa_agent_and_pass_a_varied_one():
    template = surface_metrics([_qa(r, "I need to look this up.", r["question"]) for r in QUESTIONS])
    # 20 trajectories, 20 calls, each the question verbatim; 20 spans, 1 distinct; 5 distinct queries, 4 each
    want = {"lab/trajectories": 20, "lab/tool_calls": 1.0, "lab/copy_rate": 1.0, "lab/distinct_calls": 5,
            "lab/top_call_share": 4 / 20, "lab/think_spans": 20, "lab/distinct_think": 1, "lab/top_think_share": 1.0,
            "lab/not_run": 0}
    assert template == pytest.approx(want, abs=1e-12)
    reasons = degeneracy_gate(template)
    assert [r.split(" ")[0] for r in reasons] == ["question-copy", "only", "the"] and "1.000 > 0.10" in reasons[0]
    # the bare-response form (analysis dumps, the gradient study's chunks), questions from rows by id: the same
    bare = surface_metrics([{"uid": r["id"], "response": _qa(r, "I need to look this up.", r["question"])["response"]}
                            for r in QUESTIONS], QUESTIONS)
    assert bare == pytest.approx(want, abs=1e-12)
    varied = surface_metrics([_qa(r, f"Step {k}: the passage names someone else.", f"entity {k} born")
                              for k, r in enumerate(QUESTIONS)])
    assert varied["lab/copy_rate"] == 0.0 and varied["lab/distinct_think"] == 20
    assert varied["lab/top_call_share"] == 1 / 20 and varied["lab/distinct_calls"] == 20
    assert degeneracy_gate(varied) == []
    # a question never known: no copy rate (NaN), the other rules still judged
    unknown = surface_metrics([{"id": "x", "tool_calls": [{"query": "q", "observation": ""}], "response": ""}])
    assert unknown["lab/copy_rate"] != unknown["lab/copy_rate"] and unknown["lab/tool_calls"] == 1.0


def _sql(k: int, query: str, think: str) -> dict:
    obs = "| a | b |\n| 1 | 2 |"
    return {"id": f"bird-{k}", "question": f"How many schools in county {k} have more than {k} pupils?",
            "tool_calls": [{"query": query, "observation": obs}],
            "response": f"<think> {think} </think>\n<sql> {query} </sql>\n\n<observation>{obs}</observation>\n\n"
                        "<solution> SELECT 1 </solution>", "finish": "answer"}


def test_call_shape_and_the_sql_template():
    assert call_shape("SELECT * FROM schools LIMIT 3") == call_shape("select *  from `frpm` limit 5") == \
        "select * from id limit ?"
    assert call_shape("SELECT COUNT(*) FROM frpm WHERE \"County Name\" = 'Alameda' AND x >= 2.5") == \
        "select count ( * ) from id where id = ? and id > = ?"
    assert call_shape("Who wrote Moby-Dick?") == "who wrote mobydick"  # a text query: SQuAD-normalised
    tables = ["schools", "frpm", "satscores"]
    template = [_sql(k, f"SELECT * FROM {tables[k % 3]} LIMIT 3", f"Table {k} may hold the count.") for k in range(12)]
    m = surface_metrics(template)
    # 12 calls, 3 distinct texts, one shape: 100%; 12 distinct spans; no call copies its question
    assert (m["lab/top_call_share"], m["lab/distinct_calls"], m["lab/copy_rate"], m["lab/distinct_think"]) == \
        (1.0, 3, 0.0, 12)
    assert degeneracy_gate(m) == ["the commonest tool-call shape is 100.0% of 12 calls (> 50%): template tool use"]
    assert degeneracy_gate(m, max_top_call=1.0) == []
    # four shapes, three calls each: the commonest is 25%
    shapes = ["SELECT COUNT(*) FROM {t} WHERE a > {k}", "SELECT name FROM {t} ORDER BY b DESC LIMIT 1",
              "SELECT T1.a FROM {t} AS T1 JOIN frpm AS T2 ON T1.id = T2.id", "PRAGMA table_info({t})"]
    varied = [_sql(k, shapes[k % 4].format(t=tables[k % 3], k=k), f"Table {k} may hold the count.")
              for k in range(12)]
    v = surface_metrics(varied)
    assert v["lab/top_call_share"] == 0.25 and degeneracy_gate(v) == []
    # the bare SQL response and the rollouts.jsonl pieces read the same calls as the evaluation record
    t = trajectory({"id": "b", "response": template[0]["response"]})
    assert t["calls"] == [("SELECT * FROM schools LIMIT 3", "| a | b |\n| 1 | 2 |")]
    assert t["think"] == ["Table 0 may hold the count."]
    pieces = [{"text": "<think> t </think>\n<sql> SELECT 1 </sql>", "loss": 1},
              {"text": "\n\n<observation>| 1 |</observation>\n\n", "loss": 0},
              {"text": "<solution> SELECT 1 </solution>", "loss": 1}]
    assert trajectory({"uid": "b", "pieces": pieces})["calls"] == [("SELECT 1", "| 1 |")]
    # too few calls to judge the shape rule
    assert degeneracy_gate(surface_metrics(template[:9])) == []
