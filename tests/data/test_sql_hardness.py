"""Spider's hardness levels (dart_jax.data.sql_hardness): hand-worked counts, the published split of
Spider dev, and the `max_hardness` row filter."""

import collections
import json
import os

import pytest

from dart_jax.data.paths import DATA
from dart_jax.data.readers import DataError, load_rows, select_rows
from dart_jax.data.spider_split import train_specs
from dart_jax.data.sql_hardness import HardnessError, components, hardness, level

# (query, (component1, component2, others), level), each worked by hand from Spider's rules
CASES = [
    ("SELECT count(*) FROM singer", (0, 0, 0), "easy"),
    ("SELECT name FROM singer WHERE age > 20", (1, 0, 0), "easy"),
    # ORDER BY (c1 1) + three selected columns (others 1)
    ("SELECT name, country, age FROM singer ORDER BY age DESC", (1, 0, 1), "medium"),
    # WHERE + LIKE (c1 2)
    ("SELECT name FROM singer WHERE name LIKE '%a%'", (2, 0, 0), "medium"),
    # JOIN (c1 1) + WHERE (c1 1); two selected columns (others 1)
    ("SELECT T2.name, T1.year FROM concert AS T1 JOIN stadium AS T2 ON T1.stadium_id = T2.stadium_id "
     "WHERE T1.year = 2014", (2, 0, 1), "medium"),
    # GROUP BY + ORDER BY + LIMIT (c1 3), aggregates: count in ORDER BY only (1, not > 1)
    ("SELECT country FROM singer GROUP BY country ORDER BY count(*) DESC LIMIT 1", (3, 0, 0), "hard"),
    # a nested query as a WHERE value (c2 1), NOT IN counts as Spider's `not` "aggregation" (1, not > 1)
    ("SELECT name FROM stadium WHERE stadium_id NOT IN (SELECT stadium_id FROM concert)", (1, 1, 0), "hard"),
    # INTERSECT (c2 1); the left query: JOIN + WHERE (c1 2), one column
    ("SELECT T2.name FROM concert AS T1 JOIN stadium AS T2 ON T1.stadium_id = T2.stadium_id WHERE T1.year = 2014 "
     "INTERSECT SELECT T2.name FROM concert AS T1 JOIN stadium AS T2 ON T1.stadium_id = T2.stadium_id "
     "WHERE T1.year = 2015", (2, 1, 0), "extra"),
    # WHERE with OR (c1 2), two conditions (others 1)
    ("SELECT name FROM singer WHERE age < 20 OR age > 40", (2, 0, 1), "medium"),
    # two aggregates, two columns (others 2), no clause
    ("SELECT max(age), min(age) FROM singer", (0, 0, 2), "medium"),
    # HAVING with one condition: Spider counts its connectors, none here; GROUP BY (c1 1)
    ("SELECT country FROM singer GROUP BY country HAVING count(*) > 1", (1, 0, 0), "easy"),
    # a subquery in FROM is not counted as nested (as in Spider)
    ("SELECT count(*) FROM (SELECT name FROM singer)", (0, 0, 0), "easy"),
]


@pytest.mark.parametrize("sql,expected,lvl", CASES)
def test_hand_worked_counts(sql, expected, lvl):
    assert components(sql) == expected
    assert hardness(sql) == lvl


def test_level_boundaries():
    assert level(1, 0, 0) == "easy"
    assert level(2, 0, 1) == "medium" and level(1, 0, 2) == "medium"
    assert level(3, 0, 2) == "hard" and level(2, 0, 3) == "hard" and level(1, 1, 0) == "hard"
    assert level(4, 0, 0) == "extra" and level(1, 1, 1) == "extra" and level(0, 2, 0) == "extra"


def test_spider_dev_matches_the_published_split():
    """Spider's evaluation reports dev as 248 easy / 446 medium / 174 hard / 166 extra (1,034)."""
    with open(os.path.join(DATA, "spider", "dev_questions.jsonl")) as f:
        rows = [json.loads(line) for line in f]
    got = collections.Counter(hardness(r["query"]) for r in rows)
    assert (len(rows), got["easy"], got["medium"], got["hard"], got["extra"]) == (1034, 248, 446, 174, 166)


def test_not_a_select_is_a_clear_error():
    with pytest.raises(HardnessError, match="not a SELECT"):
        hardness("DELETE FROM singer")


def test_max_hardness_filter():
    rows = [{"query": q} for q, _, _ in CASES]
    kept = select_rows(rows, {"max_hardness": "medium"})
    assert [r["query"] for r in kept] == [q for q, _, lvl in CASES if lvl in ("easy", "medium")]
    assert len(select_rows(rows, {"max_hardness": "extra"})) == len(rows)
    with pytest.raises(ValueError, match="hardness 'simple'"):
        select_rows(rows, {"max_hardness": "simple"})
    with pytest.raises(DataError, match="max_hardness"):
        select_rows([{"query": "DROP TABLE singer"}], {"max_hardness": "easy"})


def test_training_side_easy_rows():
    """The SQL quickstart's GRPO source: fold 1 of the training databases, easy gold queries only."""
    spec = dict(train_specs(1, sources=("spider_dev",))[0], max_hardness="easy")
    rows = load_rows(spec)
    assert len(rows) == 70 and all(hardness(r["query"]) == "easy" for r in rows)
