"""The lab's world and questions: deterministic from a seed (byte-identical files), every gold answer
recomputed from the world's facts in every (hops, op) cell, bridge entities never named in a
question, every value a lookup needs stated in its passage, unique names that never occur inside
one another, and a corpus the Search-R1 readers take; passages and questions measured with the
real SmolLM2 tokenizer."""

import json
import re

import numpy as np
import pytest

from dart_jax.data.corpus import CorpusFile, line_offsets, read_corpus
from dart_jax.data.readers import read_flashrag_jsonl
from dart_jax.data.text import normalize_answer
from dart_jax.errors import UserError
from dart_jax.lab.questions import BRANCHES, HOPS, OPS, check_answer, make_questions
from dart_jax.lab.world import ATTRIBUTES, RELATIONS, Entity, World, generate_world, load_world
from dart_jax.rewards.qa import em
from launch import lab_build

PER_CELL = 200  # 3,600 questions over the 18 cells of the default world


@pytest.fixture(scope="module")
def world():
    return generate_world(0)


@pytest.fixture(scope="module")
def rows(world):
    return make_questions(world, PER_CELL, seed=0)


def _named(name: str, text: str) -> bool:
    return re.search(r"(?<![\w])" + re.escape(name) + r"(?![\w])", text, re.I) is not None


def test_same_seed_same_world_and_questions_other_seed_differs():
    a, b, c = generate_world(3, "small"), generate_world(3, "small"), generate_world(4, "small")
    assert a.to_json() == b.to_json() and a.corpus_rows() == b.corpus_rows()
    assert make_questions(a, 5, seed=1) == make_questions(b, 5, seed=1)
    assert make_questions(a, 5, seed=1) != make_questions(a, 5, seed=2)
    names_a, names_c = {e.name for e in a.entities.values()}, {e.name for e in c.entities.values()}
    assert len(names_a & names_c) < 0.05 * len(names_a)  # the held-out world has other names and facts
    assert a.passages != c.passages


def test_builder_writes_byte_identical_files(tmp_path, capsys):
    for out in ("a", "b"):
        assert lab_build.main([f"--out={tmp_path / out}", "--seed=5", "--size=small", "--per-cell=4"]) == 0
    for name in ("world.json", "corpus.jsonl", "questions.jsonl", "stats.json"):
        assert (tmp_path / "a" / name).read_bytes() == (tmp_path / "b" / name).read_bytes(), name
    assert load_world(str(tmp_path / "a")) == generate_world(5, "small")
    stats = json.loads((tmp_path / "a" / "stats.json").read_text())
    assert stats["questions"] == 4 * 18 and set(stats["cells"].values()) == {4}
    assert "lab world 5" in capsys.readouterr().out


def test_builder_refuses_bad_dials_in_one_line(tmp_path):
    with pytest.raises(UserError, match="not a dial setting"):
        lab_build.main([f"--out={tmp_path}", "--size=small", "--hops=4"])
    with pytest.raises(UserError, match="integers"):
        lab_build.main([f"--out={tmp_path}", "--size=small", "--hops=two"])
    with pytest.raises(UserError, match="unknown"):
        generate_world(0, "huge")
    with pytest.raises(UserError, match="no lab world"):
        load_world(str(tmp_path / "nothing"))


def test_every_cell_is_filled_with_distinct_questions(rows):
    cells = {}
    for r in rows:
        cells[(r["lab"]["hops"], r["lab"]["op"])] = cells.get((r["lab"]["hops"], r["lab"]["op"]), 0) + 1
    assert cells == {(h, o): PER_CELL for h in HOPS for o in OPS}
    assert len({r["question"] for r in rows}) == len(rows) and len({r["id"] for r in rows}) == len(rows)
    assert all(r["data_source"] == "lab" and r["id"].startswith("lab0-q") for r in rows)


def _recompute_from_values(world, row) -> str:
    """The answer worked out from the stored gold values (per branch: h-1 relation steps, then the
    target), each checked against the world's facts: an independent path from check_answer's."""
    lab, spec = row["lab"], row["lab"]["spec"]
    h, op = lab["hops"], lab["op"]
    per = len(lab["values"]) // BRANCHES[op]
    assert per == h and len(lab["chain"]) == h * BRANCHES[op]
    finals = []
    for b in range(BRANCHES[op]):
        vals = lab["values"][b * per:(b + 1) * per]
        ents = lab["chain"][b * h:(b + 1) * h]
        assert ents[0] == spec["starts"][b] and [v["entity"] for v in vals] == ents
        for v, nxt in zip(vals[:-1], ents[1:]):  # each bridge is the relation's target, read in the passage before
            e = world.entities[v["entity"]]
            assert e.rels[v["attr"]] == nxt and world.entities[nxt].name == v["value"]
        last = world.entities[vals[-1]["entity"]]
        fact = last.attrs.get(vals[-1]["attr"])
        if fact is None:
            fact = world.entities[last.rels[vals[-1]["attr"]]].name
        assert fact == vals[-1]["value"]
        finals.append((last, fact))
    values = [f for _, f in finals]
    if op == "none":
        return str(values[0])
    if op == "compare":
        best = sorted(finals, key=lambda ef: ef[1], reverse=spec["cmp"] == "max")
        assert best[0][1] != best[1][1]
        return best[0][0].name
    if op == "diff":
        return str(abs(values[0] - values[1]))
    if op == "sum":
        return str(values[0] + values[1])
    ok = [v < spec["threshold"] if spec["test"] == "lt" else v > spec["threshold"] if spec["test"] == "gt"
          else v == spec["value"] for v in values]
    return str(sum(ok)) if op == "count" else ("yes" if ok[0] else "no")


def test_every_gold_answer_recomputed_from_the_facts(world, rows):
    for r in rows:
        assert check_answer(world, r) == r["lab"]["answer"] == r["golden_answers"][0], r["id"]
        assert _recompute_from_values(world, r) == r["lab"]["answer"], r["id"]
        assert r["lab"]["titles"] == [world.entities[i].name for i in r["lab"]["chain"]]


def test_check_answer_on_a_hand_made_world():
    """Two people, two firms: the answers worked out by hand."""
    ents = {
        "person-0": Entity("person-0", "person", "Ama Tor", {"born": 1900, "awards": 3, "role": "poet"},
                           {"employer": "org-0", "birthplace": "place-0"}),
        "person-1": Entity("person-1", "person", "Bel Tor", {"born": 1910, "awards": 5, "role": "chemist"},
                           {"employer": "org-1", "birthplace": "place-0"}),
        "org-0": Entity("org-0", "org", "Tor Works", {"founded": 1950, "employees": 40, "field": "mining"},
                        {"founder": "person-1", "headquarters": "place-0"}),
        "org-1": Entity("org-1", "org", "Vel Press", {"founded": 1930, "employees": 60, "field": "printing"},
                        {"founder": "person-0", "headquarters": "place-0"}),
        "place-0": Entity("place-0", "place", "Sarvik", {"founded": 1200, "population": 900, "region": "Oria"},
                          {"mayor": "person-0"}),
    }
    w = World(0, ents, {i: "" for i in ents})

    def row(op, **spec):
        return {"lab": {"op": op, "spec": spec}}
    two = ["person-0", "person-1"]
    assert check_answer(w, row("none", starts=["person-0"], path=["employer"], target="founded")) == "1950"
    assert check_answer(w, row("none", starts=["org-0"], path=["founder"], target="employer")) == "Vel Press"
    assert check_answer(w, row("compare", starts=two, path=["employer"], target="founded", cmp="min")) == "Vel Press"
    assert check_answer(w, row("diff", starts=two, path=["employer"], target="founded")) == "20"
    assert check_answer(w, row("sum", starts=two, path=["employer"], target="employees")) == "100"
    assert check_answer(w, row("count", starts=two, path=[], target="born", test="lt", threshold=1905)) == "1"
    assert check_answer(w, row("bool", starts=["org-0"], path=["founder", "employer"], target="field",
                               test="eq", value="printing")) == "yes"


def test_only_start_entities_are_named_in_the_question(world, rows):
    for r in rows:
        starts = r["lab"]["spec"]["starts"]
        for i in starts:
            assert _named(world.entities[i].name, r["question"]), r["question"]
        for i in r["lab"]["chain"]:
            if i not in starts:
                assert not _named(world.entities[i].name, r["question"]), (r["question"], i)


def _stated(value, passage: str) -> bool:
    return _named(str(value), passage)


def test_each_chain_passage_states_the_values_its_lookup_needs(world, rows):
    for r in rows:
        for v in r["lab"]["values"]:
            assert _stated(v["value"], world.passages[v["entity"]]), (r["id"], v)


def test_every_passage_states_every_fact_and_names_a_distractor(world):
    for e in world.entities.values():
        p = world.passages[e.id]
        assert p.startswith(e.name)
        assert set(e.attrs) == set(ATTRIBUTES[e.kind]) and set(e.rels) == set(RELATIONS[e.kind])
        for v in e.attrs.values():
            assert _stated(v, p), (e.id, v)
        related = {world.entities[t].name for t in e.rels.values()}
        for name in related:
            assert _stated(name, p), (e.id, name)
    others = 0
    for e in world.entities.values():
        related = {world.entities[t].name for t in e.rels.values()} | {e.name}
        mentioned = set(re.findall(r"(?:The )?[A-Z][a-z]+ [A-Z][a-z]+|[A-Z][a-z]+", world.passages[e.id]))
        others += any(world.by_name(m) and m not in related for m in mentioned)
    assert others >= 0.95 * len(world.entities)  # distractor names (a rare draw lands on a relation and is dropped)


def test_names_are_unique_never_inside_one_another_and_share_parts(world):
    names = [e.name for e in world.entities.values()]
    assert len(set(names)) == len(names)
    words = {}
    for n in names:
        for w in n.split():
            words[w] = words.get(w, 0) + 1
    lookup = set(names)
    for n in names:  # no full name is a word run of another name
        parts = n.split()
        subs = {" ".join(parts[i:j]) for i in range(len(parts)) for j in range(i + 1, len(parts) + 1)} - {n}
        assert not subs & lookup, n
    shared = sum(any(words[w] > 1 for w in n.split() if w != "The") for n in names)
    assert shared > 0.8 * len(names)  # look-alikes: most names share a part with another
    assert all(world.by_name(n).name == n for n in names[:50])


def test_answers_are_short_and_em_matches_them(world, rows):
    kinds = set()
    for r in rows:
        a = r["lab"]["answer"]
        assert 1 <= len(a.split()) <= 4 and normalize_answer(a)
        assert em(a, r["golden_answers"]) == 1.0 and em(f"The answer is {a}", r["golden_answers"]) == 0.0
        kinds.add("yes/no" if a in ("yes", "no") else "number" if a.isdigit() else
                  "name" if world.by_name(a) else "word")
    assert kinds == {"yes/no", "number", "name", "word"}


def test_corpus_is_search_r1_and_questions_read_as_qa_rows(tmp_path, world):
    world.save(str(tmp_path))
    path = str(tmp_path / "corpus.jsonl")
    rows = read_corpus(path)
    assert len(rows) == len(world.entities)
    assert rows[0] == {"id": f"lab0-{next(iter(world.entities))}", "contents": world.corpus_rows()[0]["contents"]}
    np_path = str(tmp_path / "corpus.offsets.npy")
    np.save(np_path, line_offsets(path))
    cf = CorpusFile(path, np_path)
    try:
        for k in (0, len(rows) // 2, len(rows) - 1):
            title, text = cf[k]["contents"].split("\n", 1)
            e = world.entities[cf[k]["id"][len("lab0-"):]]
            assert title == f"\"{e.name}\"" and text == world.passages[e.id]
    finally:
        cf.close()
    qpath = tmp_path / "questions.jsonl"
    qrows = make_questions(world, 2, seed=0)
    qpath.write_text("".join(json.dumps(r) + "\n" for r in qrows))
    read = read_flashrag_jsonl(str(qpath))
    assert [(r["question"], r["golden_answers"]) for r in read] == [(r["question"], r["golden_answers"]) for r in qrows]


def test_passages_and_questions_fit_a_small_context():
    """Real SmolLM2 tokens: a passage ~60–120 (title line included), a question well under 64."""
    from dart_jax.tokenization.tokenizer import load_tokenizer
    tok = load_tokenizer("smollm2-135m-instruct")
    w = generate_world(1, "small")
    lens = sorted(len(tok(r["contents"])["input_ids"]) for r in w.corpus_rows())
    assert lens[0] >= 45 and lens[len(lens) // 2] <= 100 and lens[-1] <= 140, (lens[0], lens[-1])
    q = [len(tok(r["question"])["input_ids"]) for r in make_questions(w, 10, seed=0)]
    assert max(q) <= 64, max(q)
