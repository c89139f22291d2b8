"""SQL rewards: REFERENCE §9 unit cases and every runnable Spider dev gold query against itself."""

import os

import pytest

from dart_jax.rewards.sql import (
    bird_result_eq,
    execution_match,
    remove_distinct,
    spider_result_eq,
    sql_format_ok,
    sql_training_reward,
    verify_format_and_extract,
)
from dart_jax.rewards.training import RewardConfig, SQLReward

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


def test_keep_distinct_hand_worked():
    """test-suite-sql-eval's default (`--keep_distinct` off) deletes every DISTINCT keyword from both queries
    before running them; keep_distinct=True (ours) runs them as written. concert_singer's singer.Country is
    Netherlands, United States and France ×4: 6 rows, 3 distinct values."""
    assert remove_distinct("SELECT DISTINCT country FROM singer") == "SELECT  country FROM singer"
    assert remove_distinct("select count(distinct Country), 'distinct' FROM singer") == \
        "select count( Country), 'distinct' FROM singer"                       # every keyword, never a string
    assert remove_distinct('SELECT "distinct" FROM t') == 'SELECT "distinct" FROM t'   # a quoted identifier stays
    assert remove_distinct("SELECT name FROM singer") == "SELECT name FROM singer"
    assert remove_distinct("SELECT Distinct(name) FROM t -- distinct\n") == "SELECT (name) FROM t -- distinct\n"
    # first statement
    assert remove_distinct("SELECT DISTINCT a FROM t; SELECT DISTINCT b FROM t") == "SELECT  a FROM t;"
    assert remove_distinct("SELEC 'unterminated") == "SELEC 'unterminated"    # unreadable: unchanged
    d = db("concert_singer")
    # as written: 3 rows against 6, no match; test-suite's default: both run without DISTINCT, 6 = 6
    assert not execution_match(d, "SELECT DISTINCT country FROM singer", "SELECT country FROM singer")[0]
    assert execution_match(d, "SELECT DISTINCT country FROM singer", "SELECT country FROM singer",
                           keep_distinct=False)[0]
    # …and the other way round: a gold DISTINCT is deleted too, so the prediction without it matches
    assert not execution_match(d, "SELECT country FROM singer", "SELECT DISTINCT country FROM singer")[0]
    assert execution_match(d, "SELECT country FROM singer", "SELECT DISTINCT country FROM singer",
                           keep_distinct=False)[0]
    # COUNT(DISTINCT x) loses its DISTINCT as well: 3 as written, 6 with test-suite's default
    assert not execution_match(d, "SELECT count(country) FROM singer", "SELECT count(DISTINCT country) FROM singer")[0]
    assert execution_match(d, "SELECT count(country) FROM singer", "SELECT count(DISTINCT country) FROM singer",
                           keep_distinct=False)[0]
    with pytest.raises(ValueError, match="keep_distinct"):
        execution_match(d, "SELECT 1", "SELECT 1", semantics="bird", keep_distinct=False)


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
    good = GOOD
    assert sql_format_ok(good)
    assert sql_training_reward(good, d, "SELECT count(*) FROM singer") == 1.0
    assert sql_training_reward(good, d, "SELECT count(*) FROM stadium") == -1.0
    no_think_after_obs = good.replace("<think>six</think>", "")
    assert (not sql_format_ok(no_think_after_obs)
            and sql_training_reward(no_think_after_obs, d, "SELECT count(*) FROM singer") == -1.0)
    two = good + "<solution>SELECT 1</solution>"
    assert sql_training_reward(two, d, "SELECT count(*) FROM singer") == -1.0


# SkyRL's own cases (skyrl-gym/tests/test_sql.py, test_verify_format_and_extract), verbatim inputs
SKYRL_FORMAT_CASES = [
    ("<think>I need to query the database</think>\n<solution>SELECT * FROM users;</solution>", True, "valid_format"),
    ("<solution>SELECT * FROM users;</solution>", False, "missing_think_tag"),
    ("<think>thinking</think>\n<solution>SELECT * FROM users;<solution>more text</solution>", False,
     "multiple_solution_start_tags"),
    ("<think>thinking</think>\n<solution>SELECT * FROM users;</solution>extra</solution>", False,
     "multiple_solution_end_tags"),
    ("<think>thinking</think>\nSELECT * FROM users;</solution>", False, "missing_solution_start_tag"),
    ("<think>thinking</think>\n<solution>SELECT * FROM users;", False, "missing_solution_end_tag"),
    ("<think>thinking</think>\nsome text<solution>", False, "solution_start_at_end"),
    ("<think>thinking</think>\n<solution>SELECT * FROM users; <sql>forbidden</sql></solution>", False,
     "solution_contains_forbidden_sql_tag"),
    ("<think>thinking</think>\n<solution>SELECT * FROM users; <observation>forbidden</observation></solution>", False,
     "solution_contains_forbidden_observation_tag"),
    ("<think>thinking</think>\n<solution></solution>", True, "empty_solution_content"),
    ("<think>first thought</think>\n<think>second thought</think>\n<solution>SELECT * FROM users;</solution>", True,
     "multiple_think_tags"),
    ("<observation>some observation</observation>\n<think>thinking</think>\n<solution>SELECT * FROM users;</solution>",
     True, "observation_then_think"),
    ("<observation>some observation</observation>\nrandom text\n<think>thinking</think>\n<solution>SELECT * FROM "
     "users;</solution>", False, "observation_not_followed_by_think"),
    ("some text<solution>", False, "solution_tag_at_end_no_content"),
    ("</solution><solution>content</solution>", False, "end_tag_before_start_tag"),
    ("<solution><solution>content</solution>", False, "malformed_nested_tags"),
    ("some text</solution>", False, "only_end_tag"),
    ("", False, "empty_string"),
    ("<solution>content without end", False, "only_start_tag"),
]


@pytest.mark.parametrize("output, expected, name", SKYRL_FORMAT_CASES, ids=[c[2] for c in SKYRL_FORMAT_CASES])
def test_format_check_agrees_with_skyrls_cases(output, expected, name):
    valid, thoughts, solution = verify_format_and_extract(output)
    assert valid == expected == sql_format_ok(output)
    if valid:
        assert thoughts and solution is not None
    else:
        assert thoughts is None and solution is None


GOOD = ("<think>count rows</think><sql>SELECT count(*) FROM singer</sql>\n\n<observation>| 6 |</observation>"
        "\n\n<think>six</think><solution>SELECT count(*) FROM singer</solution>")


def test_shapings_and_empty_gold_hand_worked():
    """paper: +1 match / −1 otherwise; skyrl: +1 / 0 wrong / −1 format. An empty gold result scores as
    wrong unless reward_empty_gold (SkyRL issue 2451); a prediction that fails scores as wrong."""
    d = db("concert_singer")
    empty_gold = "SELECT name FROM singer WHERE age > 1000"
    empty_pred = GOOD.replace("SELECT count(*) FROM singer</solution>", "SELECT 1 WHERE 0</solution>")
    failing = GOOD.replace("SELECT count(*) FROM singer</solution>", "SELECT nope FROM singer</solution>")
    bad_format = GOOD.replace("<think>six</think>", "")
    cases = [  # (response, gold, paper, skyrl, skyrl with reward_empty_gold)
        (GOOD, "SELECT count(*) FROM singer", 1.0, 1.0, 1.0),
        (GOOD, "SELECT count(*) FROM stadium", -1.0, 0.0, 0.0),
        (failing, "SELECT count(*) FROM singer", -1.0, 0.0, 0.0),
        (bad_format, "SELECT count(*) FROM singer", -1.0, -1.0, -1.0),
        (empty_pred, empty_gold, -1.0, 0.0, 1.0),
        (GOOD, empty_gold, -1.0, 0.0, 0.0),
    ]
    for response, gold, paper, skyrl, legacy in cases:
        assert sql_training_reward(response, d, gold) == paper
        assert sql_training_reward(response, d, gold, shaping="skyrl") == skyrl
        assert sql_training_reward(response, d, gold, shaping="skyrl", reward_empty_gold=True) == legacy
    with pytest.raises(ValueError, match="shaping"):
        sql_training_reward(GOOD, d, "SELECT 1", shaping="binary")


def _solution(sql):
    return GOOD.replace("SELECT count(*) FROM singer</solution>", f"{sql}</solution>")


def test_match_set_vs_spider_hand_worked():
    """sql_match: `set` (SkyRL's frozenset: row order and duplicates ignored, columns in order) against
    `spider` (Spider EX: multisets, ordered when the gold has ORDER BY, columns may be permuted).
    Rows of concert_singer.singer in table order: Joe Sharp 52, Timbaland 32, Justin Brown 29,
    Rose White 41, John Nizinik 43, Tribal King 25 (Netherlands, US, then four France)."""
    d = db("concert_singer")
    by_age = "SELECT name FROM singer ORDER BY age DESC"
    cases = [  # (predicted SQL, gold SQL, set, spider)
        ("SELECT name FROM singer ORDER BY age DESC", by_age, True, True),
        ("SELECT name FROM singer", by_age, True, False),                # the right rows, unordered
        ("SELECT name FROM singer ORDER BY age ASC", by_age, True, False),  # reversed
        ("SELECT name FROM singer ORDER BY age DESC", "SELECT name FROM singer", True, True),  # no ORDER BY: any order
        # duplicates count in Spider EX (this repo runs DISTINCT as written)
        ("SELECT DISTINCT country FROM singer", "SELECT country FROM singer", True, False),
        ("SELECT age, name FROM singer", "SELECT name, age FROM singer", False, True),  # columns swapped
        ("SELECT name FROM singer WHERE age > 40", by_age, False, False),
        ("SELECT name FROM singer ORDER BY age desc", "SELECT name FROM singer order  by age DESC", True, True),
        ("SELECT name FROM singer", "SELECT name FROM singer order\n  by age DESC", True, False),  # loose ORDER BY
    ]
    for pred, gold, want_set, want_spider in cases:
        response = _solution(pred)
        assert sql_training_reward(response, d, gold) == (1.0 if want_set else -1.0), (pred, gold)
        assert sql_training_reward(response, d, gold, match="set") == (1.0 if want_set else -1.0), (pred, gold)
        assert sql_training_reward(response, d, gold, match="spider") == (1.0 if want_spider else -1.0), (pred, gold)
        assert sql_training_reward(response, d, gold, match="spider", shaping="skyrl") == (1.0 if want_spider else 0.0)
    # the batch form agrees, with the gold SQL taken from each row's metadata
    texts = [_solution(p) for p, *_ in cases]
    metas = [{"db_path": d, "gold_sql": g} for _, g, *_ in cases]
    for match, col in (("set", 2), ("spider", 3)):
        out = SQLReward(RewardConfig(sql_match=match, workers=2)).score(texts, metas)
        assert out.scores.tolist() == [1.0 if c[col] else -1.0 for c in cases], match
        assert out.counts["match"] == sum(c[col] for c in cases)
    # a format failure stays a format failure under either comparison
    bad_format = GOOD.replace("<think>six</think>", "")
    assert sql_training_reward(bad_format, d, by_age, match="spider", shaping="skyrl") == -1.0
    with pytest.raises(ValueError, match="sql_match"):
        RewardConfig(sql_match="ordered")
    with pytest.raises(ValueError, match="match"):
        sql_training_reward(GOOD, d, by_age, match="ordered")
    from dart_jax.rewards.sql import training_outcome
    with pytest.raises(ValueError, match="gold SQL"):
        training_outcome(True, [(1,)], [(1,)], match="spider")


def test_batch_reward_drops_failing_gold_caches_and_runs_in_threads(monkeypatch):
    """A gold query that fails or times out marks its rows invalid (never raises); each question's
    gold runs once however many samples share it; predictions of a step run concurrently."""
    import threading
    import time

    from dart_jax.rewards import training
    d = db("concert_singer")
    calls, threads = [], set()
    real = training.execute

    def spy(path, sql, timeout_s, max_rows):
        calls.append(sql)
        threads.add(threading.get_ident())
        time.sleep(0.05)
        return real(path, sql, timeout_s, max_rows)

    monkeypatch.setattr(training, "execute", spy)
    slow = ("WITH RECURSIVE c(x) AS (SELECT 1 UNION ALL SELECT x + 1 FROM c) SELECT count(*) FROM c")
    gold = "SELECT COUNT(*) FROM singer"  # spelled unlike the predictions, to count its executions
    metas = ([{"db_path": d, "gold_sql": gold}] * 4
             + [{"db_path": d, "gold_sql": "SELECT nope FROM singer"}] * 2
             + [{"db_path": d, "gold_sql": slow}] * 2)
    reward = SQLReward(RewardConfig(sql_shaping="skyrl", sql_timeout_s=0.5, workers=8))
    texts = [GOOD, GOOD.replace("singer</solution>", "stadium</solution>"), "no format", GOOD] + [GOOD] * 4
    t0 = time.monotonic()
    out = reward.score(texts, metas)
    # the slow gold hit its 0.5 s deadline (it never ends otherwise); a loose bound, as the host may be
    # loaded — that calls overlap is shown by the threads they ran on (below), not by timing
    assert time.monotonic() - t0 < 5.0
    assert out.scores[:4].tolist() == [1.0, 0.0, -1.0, 1.0]
    assert out.valid.tolist() == [True] * 4 + [False] * 4
    assert out.counts == {"match": 2, "wrong": 1, "format": 1, "empty_gold": 0, "gold_failed": 4}
    assert calls.count(gold) == 1 and calls.count(slow) == 1  # gold once per question
    assert len(threads) > 1
    calls.clear()
    reward.score(texts[:4], metas[:4])
    assert gold not in calls  # cached across steps


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
