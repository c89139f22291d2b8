"""Lab demonstrations: they follow each question's gold chain with the real (lexical) retriever over a
generated world, name entities in their queries (never the question), carry the gold values forward
in their reasoning, work the operation out, vary their phrasing, and encode as the agent's id stream."""

import collections
import json
import re

import numpy as np
import pytest

from configs import sft_quickstart
from dart_jax.data.text import normalize_answer
from dart_jax.lab import demos as L
from dart_jax.lab.questions import HOPS, OPS, check_answer, make_questions
from dart_jax.lab.world import generate_world
from dart_jax.rewards.qa import em_reward
from dart_jax.rollout.agent import observation_ids
from dart_jax.rollout.protocol import QA
from dart_jax.rollout.tasks import qa_task
from dart_jax.run.spec import run_spec
from dart_jax.sft.demos import encode_demo
from dart_jax.sft.trainer import build_demos
from dart_jax.tokenization.sentinels import add_sentinel_tokens
from dart_jax.tokenization.tokenizer import encode_text, load_tokenizer
from dart_jax.tools.lexical import LexicalRetriever, build_lexical_index
from dart_jax.tools.retrieval import RetrievalTool

CAP = 256  # observation cap (rollout.max_obs_tokens)
_THINK = re.compile(r"<think>(.*?)</think>", re.S)
_QUERY = re.compile(r"<search>(.*?)</search>", re.S)


def _index(world, root) -> str:
    root.mkdir(exist_ok=True)
    corpus = root / "corpus.jsonl"
    corpus.write_text("".join(json.dumps(r) + "\n" for r in world.corpus_rows()))
    return build_lexical_index(str(corpus), str(root / "lexical"))


@pytest.fixture(scope="module")
def lab(tmp_path_factory):
    tok = load_tokenizer("smollm2-135m-instruct")
    add_sentinel_tokens(tok)
    world = generate_world(3, "small")
    root = tmp_path_factory.mktemp("lab")
    idx = _index(world, root / "w3")
    tools = {k: RetrievalTool(LexicalRetriever(idx), topk=k) for k in (1, 3)}
    rows = make_questions(world, 12, seed=0)  # 12 per (hops, op) cell: 216 rows
    demos, stats = L.lab_demos(rows, world, tools[3], tok, CAP, seed=0)
    return {"tok": tok, "world": world, "tools": tools, "rows": rows, "demos": demos, "stats": stats, "root": root}


def _written(d) -> str:
    return "".join(p["text"] for p in d["pieces"] if p["loss"])


def _thinks(d) -> list[str]:
    return [t.strip() for t in _THINK.findall(_written(d))]


def _queries(d) -> list[str]:
    return [q.strip() for q in _QUERY.findall(_written(d))]


def test_demos_follow_the_gold_chain_in_every_cell(lab):
    world, rows, demos, stats = lab["world"], lab["rows"], lab["demos"], lab["stats"]
    assert stats["rows"] == 216 and stats["kept"] == len(demos) and stats["op_mismatch"] == 0
    assert stats["kept"] + stats["not_retrieved"] == 216 and stats["not_retrieved"] <= 5  # top-3: none dropped
    by_id = {r["id"]: r for r in rows}
    cells = collections.Counter((d["lab"]["hops"], d["lab"]["op"]) for d in demos)
    assert set(cells) == {(h, op) for h in HOPS for op in OPS} and min(cells.values()) >= 10
    tool = lab["tools"][3]
    for d in demos:
        row, lab_ = by_id[d["id"]], by_id[d["id"]]["lab"]
        question = normalize_answer(row["question"])
        names = [world.entities[e].name for e in lab_["chain"]]
        queries = _queries(d)
        assert len(names) <= len(queries) <= (1 + L.MAX_RETRIES) * len(names)
        # every query names a chain entity, in chain order, and none is (or holds) the question
        named = []
        for q in queries:
            nq = normalize_answer(q)
            assert nq != question and question not in nq, (d["id"], q)
            hit = [k for k, n in enumerate(names) if f" {normalize_answer(n)} " in f" {nq} "]
            assert hit, (d["id"], q, names)
            named.append(hit[0])
        assert sorted(set(named)) == list(range(len(names))) and named == sorted(named)
        # observations are the tool's own output; a bridge entity is read in an earlier observation
        obs = [p["text"] for p in d["pieces"] if not p["loss"]]
        assert obs == [QA.render_observation(b) for b in tool.batch(queries)]
        for k, name in enumerate(names):
            if f" {normalize_answer(name)} " not in f" {question} ":
                first = named.index(k)
                assert any(name in o for o in obs[:first]), (d["id"], name)
        # the gold intermediate values are stated in the reasoning; the answer is the gold one
        thinking = " ".join(_thinks(d))
        for v in lab_["values"]:
            assert str(v["value"]) in thinking, (d["id"], v)
        answer = _written(d).split("<answer>")[1].split("</answer>")[0].strip()
        assert answer == lab_["answer"] == check_answer(world, row)
        assert em_reward(_written(d), row["golden_answers"]) == 1.0


def test_the_operation_is_worked_out(lab):
    """The last think does the arithmetic / comparison on the gold operands, and it is right."""
    seen = collections.Counter()
    for d in lab["demos"]:
        op, last, answer = d["lab"]["op"], _thinks(d)[-1], d["golden_answers"][0]
        for a, rel, b in re.findall(r"(-?\d+) ([<>=]) (-?\d+)", last) if op in ("compare", "bool", "count") else ():
            assert {"<": int(a) < int(b), ">": int(a) > int(b), "=": a == b}[rel], (d["id"], last)
        if op == "diff":
            a, b, c = map(int, re.search(r"(\d+) (?:−|minus) (\d+) (?:=|is|gives) (\d+)", last).groups())
            assert a - b == c == int(answer) > 0
        elif op == "sum":
            a, b, c = map(int, re.search(r"(\d+) \+ (\d+) (?:=|makes) (\d+)", last).groups())
            assert a + b == c == int(answer)
        elif op == "count":
            assert len(re.findall(r"\d+ [<>] -?\d+", last)) == 3  # three checks, then the count
        elif op in ("compare", "bool"):
            assert re.search(r" [<>=≠] ", last)
        seen[op] += 1
    assert set(seen) == set(OPS)


def test_phrasing_varies_and_is_seeded(lab, capsys):
    assert all(len(v) >= 4 for v in L.TEMPLATES.values()), {k: len(v) for k, v in L.TEMPLATES.items()}
    demos = lab["demos"][:200]
    thinks = [t for d in demos for t in _thinks(d)]
    # skeletons: entity names and numbers blanked, so only the phrasing counts
    names = sorted((e.name for e in lab["world"].entities.values()), key=len, reverse=True)
    blank = re.compile("|".join(re.escape(n) for n in names))
    skel = [re.sub(r"\d+", "#", blank.sub("X", t)) for t in thinks]
    common = collections.Counter(skel).most_common(1)[0][1] / len(skel)
    forms = collections.Counter(re.sub(r"\d+", "#", blank.sub("X", q)) for d in demos for q in _queries(d))
    with capsys.disabled():
        print(f"\nlab demos: {len(thinks)} think spans over {len(demos)} demos, {len(set(thinks))} distinct, "
              f"{len(set(skel))} distinct skeletons (most common {common:.3f}); {len(forms)} query forms, "
              f"most common {forms.most_common(3)}")
    assert len(set(thinks)) >= 0.95 * len(thinks)
    assert len(set(skel)) >= 300 and common < 0.02
    assert len(forms) >= 4 and max(forms.values()) < 0.5 * sum(forms.values())
    again, _ = L.lab_demos(lab["rows"][:40], lab["world"], lab["tools"][3], lab["tok"], CAP, seed=0)
    assert again == lab["demos"][:len(again)]  # deterministic (and independent of the batch)
    other, _ = L.lab_demos(lab["rows"][:40], lab["world"], lab["tools"][3], lab["tok"], CAP, seed=1)
    assert sum(a["pieces"] != b["pieces"] for a, b in zip(again, other)) >= 35
    assert [d["id"] for d in other] == [d["id"] for d in again]


def test_encoded_as_the_agent_stream(lab, capsys):
    tok, demos = lab["tok"], lab["demos"]
    written, totals = collections.defaultdict(list), collections.defaultdict(list)
    for d in demos:
        prompt, resp, mask = encode_demo(tok, d, CAP)
        assert prompt == qa_task(tok, [d])[0][0]
        expect = []
        for p in d["pieces"]:
            n = len(observation_ids(tok, QA, p["text"], CAP)) if not p["loss"] else None
            if n is None:  # a written piece: dataset text (names, values, queries, the answer) plain
                n = len(encode_text(tok, p["text"], [tuple(x) for x in p["plain"]]))
            expect += [float(p["loss"])] * n
        assert mask == expect and mask[0] == 1.0 and mask[-1] == 1.0
        written[d["lab"]["hops"]].append(int(sum(mask)))
        totals[d["lab"]["hops"]].append(len(prompt) + len(resp))
    with capsys.disabled():
        for h in HOPS:
            print(f"lab demos hops={h}: written tokens mean {np.mean(written[h]):.0f} max {max(written[h])}; "
                  f"prompt+response mean {np.mean(totals[h]):.0f} max {max(totals[h])} (top-3, cap {CAP})")
    # short: the written part of a lookup is a sentence or two
    assert np.mean(written[1]) < 220 and max(max(v) for v in written.values()) < 800


def test_reformulates_or_drops_and_counts(lab):
    world, rows, tok = lab["world"], lab["rows"], lab["tok"]
    demos, stats = L.lab_demos(rows, world, lab["tools"][1], tok, CAP, seed=0)  # top-1: look-alikes win
    assert stats["reformulated"] >= 10
    assert stats["kept"] == len(demos) == stats["rows"] - stats["not_retrieved"] - stats["op_mismatch"]
    reform = [d for d in demos if d["lab"]["reformulated"]]
    assert len(reform) == stats["reformulated"]
    words = set(L.ATTR_WORDS.values()) | set(L.KIND_WORDS.values())
    by_id = {r["id"]: r for r in rows}
    for d in reform:
        qs = _queries(d)
        titles = [re.findall(r"Title: \"([^\"]+)\"", p["text"]) for p in d["pieces"] if not p["loss"]]
        for e in by_id[d["id"]]["lab"]["chain"]:
            name = world.entities[e].name
            tries = [k for k, q in enumerate(qs) if name in q]
            # every try but the last missed the passage; the retries add an attribute or kind word
            assert [name in titles[k] for k in tries] == [False] * (len(tries) - 1) + [True], (d["id"], name)
            assert all(qs[k] == name or (qs[k].startswith(name + " ") and qs[k][len(name) + 1:] in words)
                       for k in tries[1:])
            assert len({normalize_answer(qs[k]) for k in tries}) == len(tries) <= 1 + L.MAX_RETRIES
    # a corpus of another world: no chain passage is ever found, every row dropped and counted
    held = generate_world(4, "small")
    tool = RetrievalTool(LexicalRetriever(_index(held, lab["root"] / "w4")), topk=3)
    none, st = L.lab_demos(rows[:30], world, tool, tok, CAP)
    assert none == [] and st["not_retrieved"] == 30
    with pytest.raises(ValueError, match="no 'lab' field"):
        L.lab_demos([{"id": "x", "question": "q?", "golden_answers": ["a"]}], world, tool, tok, CAP)


def test_sft_lab_source(lab, tmp_path):
    path = tmp_path / "questions.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in lab["rows"]))
    c = sft_quickstart.get_config()
    c.sft.data = [dict(builder="lab", path=str(path), world_size="small", hops=[1], ops=["none", "compare"], seed=2),
                  dict(builder="lab", world_seed=3, world_size="small", n=3, hops=[2], ops=["diff"],
                       question_seed=5)]
    demos, stats = build_demos(run_spec(c), lab["tok"], lambda: lab["tools"][3])
    cells = collections.Counter((d["lab"]["hops"], d["lab"]["op"]) for d in demos)
    assert cells == {(1, "none"): 12, (1, "compare"): 12, (2, "diff"): 3}
    assert stats["0:lab"]["kept"] == 24 and stats["1:lab"]["rows"] == 3
    assert all(d["task"] == "qa" and d["origin"] == "lab" for d in demos)
    c.sft.data = [dict(builder="lab", world_seed=3, world_size="small")]
    with pytest.raises(ValueError, match="set path"):
        build_demos(run_spec(c), lab["tok"], lambda: lab["tools"][3])
    c.sft.data = [dict(builder="lab", path=str(path))]  # the default-size world is not the questions' world
    with pytest.raises(ValueError, match="made on another world"):
        build_demos(run_spec(c), lab["tok"], lambda: lab["tools"][3])
