"""The lab's measured figures on the small world with the real lexical retriever (SQLite FTS5 over the
world's corpus, built in a tmp dir): the statistics add up, every query kind is measured with rates and
Wilson intervals in [0, 1], and an entity's exact name finds its passage (top-3 >= 0.95; measured 1.000
on 4 questions per cell: 158 distinct chain entities)."""

import json
import os

import pytest

from dart_jax.lab.questions import HOPS, OPS, make_questions
from dart_jax.lab.report import KINDS, retrieval_accuracy, world_statistics
from dart_jax.lab.world import KINDS as ENTITY_KINDS, generate_world
from dart_jax.tools.lexical import LexicalRetriever, build_lexical_index

PER_CELL = 4


@pytest.fixture(scope="module")
def world():
    return generate_world(0, "small")


@pytest.fixture(scope="module")
def rows(world):
    return make_questions(world, PER_CELL, seed=0)


@pytest.fixture(scope="module")
def lexical(world, tmp_path_factory):
    d = str(tmp_path_factory.mktemp("lab_lexical"))
    world.save(d)
    return LexicalRetriever(build_lexical_index(os.path.join(d, "corpus.jsonl"), os.path.join(d, "index")))


def test_statistics_add_up(world, rows):
    s = world_statistics(world, rows)
    assert s["unit"] == "words"
    assert set(s["entities"]) == set(ENTITY_KINDS) and sum(s["entities"].values()) == len(world.entities) == 350
    assert s["cells"] == {f"h{h}-{op}": PER_CELL for h in HOPS for op in OPS}
    assert s["questions"] == len(rows) == PER_CELL * len(HOPS) * len(OPS) == sum(s["answer_types"].values())
    assert set(s["answer_types"]) <= {"yes/no", "number", "name", "word"}
    assert s["answer_types"]["yes/no"] == PER_CELL * len(HOPS)  # the bool cells, and only they
    assert set(s["question_length"]) == {f"h{h}" for h in HOPS}
    assert sum(v["n"] for v in s["question_length"].values()) == len(rows) == s["question_length_all"]["n"]
    p = s["passage_length"]
    assert p["n"] == s["passages"] == 350 and 0 < p["min"] <= p["median"] <= p["p90"] <= p["max"]
    for h in HOPS:  # a chain holds at least one entity per hop, at most 3 branches of h
        c = s["chain_length"][f"h{h}"]
        assert h <= c["min"] and c["max"] <= 3 * h
    json.dumps(s)  # JSON-ready


def test_statistics_count_tokens_with_the_given_tokenizer(world, rows):
    """Any object with .encode(text) counts lengths; here one that counts characters."""
    class Chars:
        def encode(self, text, add_special_tokens=False):
            return list(text)
    s = world_statistics(world, rows[:10], Chars())
    assert s["unit"] == "tokens"
    assert s["question_length_all"]["max"] == max(len(r["question"]) for r in rows[:10])


def test_retrieval_accuracy_per_query_kind(world, rows, lexical):
    acc = retrieval_accuracy(world, rows, lexical, k=(1, 3))
    assert set(acc) == set(KINDS)
    assert acc["question"]["total"] == acc["question_any"]["total"] == len(rows)
    assert acc["question_bridge"]["total"] == sum(r["lab"]["hops"] >= 2 for r in rows)
    assert acc["name"]["total"] == len({e for r in rows for e in r["lab"]["chain"]})
    for kind, a in acc.items():
        for k in ("top1", "top3"):
            lo, hi = a[k]["wilson"]
            assert 0 <= lo <= a[k]["rate"] <= hi <= 1, (kind, a)
            assert a[k]["hits"] <= a["total"]
        assert a["top1"]["hits"] <= a["top3"]["hits"]
    assert acc["name"]["top3"]["rate"] >= 0.95, acc["name"]
    assert acc["name_attr"]["top3"]["rate"] >= 0.95, acc["name_attr"]
    # the question names no bridge entity: copying it cannot retrieve the second hop
    assert acc["question_bridge"]["top3"]["rate"] <= 0.2, acc["question_bridge"]
    assert acc["question"]["top3"]["hits"] <= acc["question_any"]["top3"]["hits"]
