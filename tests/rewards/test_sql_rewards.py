"""SQL rewards: REFERENCE §9 unit cases and every runnable Spider dev gold query against itself."""

import os

import pytest

from dart_jax.rewards.sql import (bird_result_eq, execution_match, spider_result_eq, sql_format_ok,
                                  sql_training_reward)

DATA = os.path.join(os.path.dirname(__file__), "..", "..", "data", "spider")


def db(name):
    return os.path.join(DATA, "database", name, f"{name}.sqlite")


def test_unit_cases():
    assert spider_result_eq([(1, "a"), (1, "a")], [(1, "a"), (1, "a")], False)
    assert not spider_result_eq([(1, "a")], [(1, "a"), (1, "a")], False)           # duplicate rows count
    assert not spider_result_eq([(1, "a"), (2, "b")], [(1, "a"), (1, "a")], False)
    assert spider_result_eq([(2,), (1,)], [(1,), (2,)], False)                   # order ignored …
    assert not spider_result_eq([(2,), (1,)], [(1,), (2,)], True)                # … unless ORDER BY
    assert spider_result_eq([("a", 1), ("b", 2)], [(1, "a"), (2, "b")], False)   # swapped columns
    assert not bird_result_eq([("a", 1)], [(1, "a")])                            # BIRD: column order counts
    assert spider_result_eq([(1,)], [(1.0,)], False) and bird_result_eq([(1,)], [(1.0,)])
    assert spider_result_eq([], [], False) and bird_result_eq([], [])
    assert bird_result_eq([(1,), (1,)], [(1,)])                                  # BIRD: sets
    assert not spider_result_eq([(1, 2)], [(1,)], False)


def test_execution_match_on_real_database():
    d = db("concert_singer")
    gold = "SELECT name, age FROM singer ORDER BY age DESC"
    assert execution_match(d, "SELECT Name, Age FROM singer ORDER BY Age DESC", gold)[0]
    assert execution_match(d, "SELECT age, name FROM singer ORDER BY age DESC", gold)[0]
    assert not execution_match(d, "SELECT name, age FROM singer ORDER BY age ASC", gold)[0]
    ok, info = execution_match(d, "SELECT nope FROM singer", gold)
    assert not ok and "no such column" in info["error"]
    assert not execution_match(d, "SELECT count(*) FROM singer", "SELECT count(*) FROM stadium")[0]
    assert not execution_match(d, "SELECT age, name FROM singer ORDER BY age DESC", gold, "bird")[0]
    with pytest.raises(ValueError, match="gold SQL fails"):
        execution_match(d, "SELECT 1", "SELECT nope FROM singer")


def test_training_reward_and_format():
    d = db("concert_singer")
    good = ("<think>count rows</think><sql>SELECT count(*) FROM singer</sql>\n\n<observation>| 6 |</observation>"
            "\n\n<think>six</think><solution>SELECT count(*) FROM singer</solution>")
    assert sql_format_ok(good)
    assert sql_training_reward(good, d, "SELECT count(*) FROM singer") == 1.0
    assert sql_training_reward(good, d, "SELECT count(*) FROM stadium") == -1.0
    no_think_after_obs = good.replace("<think>six</think>", "")
    assert not sql_format_ok(no_think_after_obs) and sql_training_reward(no_think_after_obs, d, "SELECT count(*) FROM singer") == -1.0
    two = good + "<solution>SELECT 1</solution>"
    assert sql_training_reward(two, d, "SELECT count(*) FROM singer") == -1.0


def gold_queries():
    with open(os.path.join(DATA, "dev_gold.sql")) as f:
        rows = [line.rstrip("\n").rsplit("\t", 1) for line in f if line.strip()]
    return [(q, d) for q, d in rows if d != "wta_1"]


def test_every_spider_dev_gold_query_scores_one_against_itself():
    rows = gold_queries()
    assert len(rows) == 972
    failures = [(d, q) for q, d in rows if not execution_match(db(d), q, q, "spider", timeout_s=30)[0]]
    assert failures == []


def test_hand_perturbed_gold_queries_score_as_expected():
    d = db("world_1")
    gold = "SELECT Name FROM country WHERE Continent = 'Europe' ORDER BY Population DESC LIMIT 3"
    assert execution_match(d, gold.replace("DESC", "ASC"), gold)[0] is False
    assert execution_match(d, gold.replace("LIMIT 3", "LIMIT 4"), gold)[0] is False
    assert execution_match(d, gold.replace("SELECT Name", "SELECT name"), gold)[0] is True
    assert execution_match(d, "SELECT count(*) FROM city", "SELECT count(ID) FROM city")[0] is True
