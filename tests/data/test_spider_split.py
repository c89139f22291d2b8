"""The shipped Spider data split by database (dart_jax/data/spider_split.py) and the row filters behind it
(`readers.select_rows`): the sides share no database, every shipped Spider-family question lands on
exactly one side, paraphrases of a question share their gold-query fold, and training entries
exclude every held-out question."""

import json

import pytest

from dart_jax.data import readers
from dart_jax.data.paths import DATA
from dart_jax.data.spider_split import DK_COPIES, HELDOUT_DBS, SOURCES, TRAIN_DBS, heldout_specs, train_specs
from dart_jax.eval.datasets import EVAL_SETS, load_set

ALL = tuple(s for s, _ in SOURCES)


def test_sides_are_disjoint_and_cover_every_database():
    assert not set(TRAIN_DBS) & set(HELDOUT_DBS)
    tables = {t["db_id"] for t in json.load(open(f"{DATA}/spider/tables.json"))}
    dev = {json.loads(line)["db_id"] for line in open(f"{DATA}/spider/dev_questions.jsonl")}
    assert dev <= set(TRAIN_DBS) | set(HELDOUT_DBS) and dev <= tables
    # a DK database (a modified copy) stays with its original
    for dk in ("new_concert_singer", "new_orchestra", "new_pets_1"):
        orig = dk[len("new_"):]
        assert (dk in TRAIN_DBS) == (orig in TRAIN_DBS)
    assert 0.4 < len(set(TRAIN_DBS) & dev) / len(dev) < 0.6  # about half of the dev databases


def test_every_question_lands_on_one_side_and_folds_partition_training():
    train = [readers.load_rows(s) for s in train_specs()]
    held = [readers.load_rows(s) for s in heldout_specs(ALL)]
    folds = [[readers.load_rows(s) for s in train_specs(f)] for f in (0, 1)]
    for k, (source, _) in enumerate(SOURCES):
        assert {r["db_id"] for r in train[k]} <= set(TRAIN_DBS)
        assert {r["db_id"] for r in held[k]} <= set(HELDOUT_DBS)
        ids0, ids1 = ({r["id"] for r in f[k]} for f in folds)
        assert not ids0 & ids1 and ids0 | ids1 == {r["id"] for r in train[k]}, source
        assert len(ids0) > 0.3 * len(train[k]) and len(ids1) > 0.3 * len(train[k])
    dev = sum(1 for _ in open(f"{DATA}/spider/dev_questions.jsonl"))
    # Spider dev: 493 train + 479 held out + 62 on wta_1 (not shipped) = 1,034
    assert (len(train[0]), len(held[0]), dev) == (493, 479, 1034)
    # no gold query on both sides of the fold split, a DK copy counted as its original database
    def queries(rows):
        return {(DK_COPIES.get(r["db_id"], r["db_id"]), " ".join(r["query"].lower().split()))
                for src in rows for r in src}
    assert not queries(folds[0]) & queries(folds[1])
    dk_twins = [r for r in train[3] if r["db_id"] in DK_COPIES
                and (DK_COPIES[r["db_id"]], " ".join(r["query"].lower().split())) in queries([train[0]])]
    assert len(dk_twins) >= 20  # DK questions on new_<db> whose gold query is a dev query on <db>
    # paraphrases share the gold query, so the fold: Syn's question k is dev's question k reworded; 5 of
    # the 493 pairs differ because Spider-Syn corrected the gold query, and may fall apart
    syn = {r["id"].rsplit("-", 1)[1]: readers.query_fold(r, 2) for r in train[1]}
    assert len(syn) == len(train[0]) == 493
    assert sum(syn[r["id"].rsplit("-", 1)[1]] != readers.query_fold(r, 2) for r in train[0]) == 5
    # nothing on the training side is a held-out question, by the exclude machinery as well
    keys = {readers.question_key(r) for h in held for r in h}
    assert not keys & {readers.question_key(r) for t in train for r in t}
    assert all(len(s["exclude"]) == 4 for s in train_specs())


def test_select_rows_filters_and_errors():
    rows = [{"id": str(i), "db_id": "a" if i % 2 else "b", "query": f"SELECT {i}"} for i in range(20)]
    assert [r["id"] for r in readers.select_rows(rows, {"db_ids": ["a"]})] == [str(i) for i in range(1, 20, 2)]
    shuffled = readers.select_rows(rows, {"shuffle": 3})
    assert sorted(r["id"] for r in shuffled) == sorted(r["id"] for r in rows) and shuffled != rows
    assert shuffled == readers.select_rows(rows, {"shuffle": 3})
    folds = [readers.select_rows(rows, {"query_fold": [i, 3]}) for i in range(3)]
    assert sum(map(len, folds)) == 20 and all(folds)
    # the fold ignores case and whitespace of the query, and depends on the database
    assert readers.query_fold({"db_id": "a", "query": "select  1"}, 97) == readers.query_fold(
        {"db_id": "a", "query": "SELECT 1"}, 97)
    with pytest.raises(readers.DataError, match=r"query_fold=\[3, 3\]"):
        readers.select_rows(rows, {"query_fold": [3, 3]})
    with pytest.raises(readers.DataError, match="needs SQL rows"):
        readers.select_rows([{"id": "x", "question": "q"}], {"query_fold": [0, 2]})


def rows_all(eval_set):
    return load_set(eval_set)[0]


def test_heldout_evaluation_sets():
    rows, counts = load_set(EVAL_SETS["spider_dev_heldout"])
    assert counts == {"questions": 479, "skipped_no_db": 62} and {r["db_id"] for r in rows} <= set(HELDOUT_DBS)
    rows, _ = load_set(EVAL_SETS["spider_dk_heldout"], limit=5)
    assert len(rows) == 5 and {r["db_id"] for r in rows} <= set(HELDOUT_DBS)
    assert EVAL_SETS["spider_syn_heldout"].exclusion_spec()["db_ids"] == list(HELDOUT_DBS)
    # the held-out databases' easy-graded Spider dev questions (what the SQL quickstart's curriculum trains on)
    from dart_jax.data.sql_hardness import hardness
    easy, counts = load_set(EVAL_SETS["spider_dev_heldout_easy"])
    assert counts["questions"] == 108 and all(hardness(r["query"]) == "easy" for r in easy)
    assert {r["question"] for r in easy} < {r["question"] for r in rows_all(EVAL_SETS["spider_dev_heldout"])}


def test_training_questions_evaluation_set():
    """`spider_dev_train_easy`: the SQL quickstart's GRPO questions in Spider dev phrasing — every row
    one the quickstart trains on (fold 1, easy, training databases), none the warm start demonstrated
    (fold 0), and never a source of exclusions (it is training data)."""
    from configs.quickstart_sql import get_config
    from dart_jax.data.sql_hardness import hardness
    from dart_jax.eval.datasets import exclusion_specs
    s = EVAL_SETS["spider_dev_train_easy"]
    rows, counts = load_set(s)
    assert counts == {"questions": 70, "skipped_no_db": 0}
    assert {r["db_id"] for r in rows} <= set(TRAIN_DBS) and all(hardness(r["query"]) == "easy" for r in rows)
    key = lambda r: (r["db_id"], r["question"], r["query"])  # noqa: E731
    grpo = {key(r) for spec in get_config().data.train for r in readers.load_rows(dict(spec))}
    assert {key(r) for r in rows} <= grpo
    warm = {key(r) for spec in train_specs(0) for r in readers.load_rows(spec)}
    assert not {key(r) for r in rows} & warm
    assert s.name not in {e["data_source"] for e in exclusion_specs("sql")}
    # its config entry keeps the fold (a caller of spec() / exclusion_spec() gets the same 70 questions)
    spec = s.spec()
    assert spec["query_fold"] == [1, 2] and s.exclusion_spec()["query_fold"] == [1, 2]
    assert {key(r) for r in readers.load_rows(dict(spec), base_dir=DATA)} == {key(r) for r in rows}
