"""Dataset readers on real files (the shipped NQ / HotpotQA slices and Spider databases) and on
Search-R1-shaped parquet written here with pyarrow."""

import json
import os

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from dart_jax.data import readers
from dart_jax.data.paths import DATA


def _search_r1_parquet(path, source, ids_col=True):
    prompt = ("Answer the given question. ... For example, <answer> Beijing </answer>. Question: {q}?\n")
    rows = [{"data_source": source, "prompt": [{"role": "user", "content": prompt.format(q=q)}],
             "ability": "fact-reasoning",
             "reward_model": {"style": "rule", "ground_truth": {"target": gold}},
             "extra_info": {"split": "train", "index": k}}
            for k, (q, gold) in enumerate([("who wrote hamlet", ["Shakespeare"]),
                                           ("capital of france", ["Paris", "paris city"])])]
    if ids_col:
        for k, r in enumerate(rows):
            r["id"] = f"train_{k}"
            r["golden_answers"] = r["reward_model"]["ground_truth"]["target"]
    pq.write_table(pa.Table.from_pylist(rows), path)


def test_search_r1_parquet_merge_has_unique_uids(tmp_path):
    nq, hp = str(tmp_path / "nq.parquet"), str(tmp_path / "hp.parquet")
    _search_r1_parquet(nq, "nq")
    _search_r1_parquet(hp, "hotpotqa", ids_col=False)  # only reward_model.ground_truth and the prompt
    a, b = readers.read_search_r1_parquet(nq), readers.read_search_r1_parquet(hp)
    assert a[0] == {"id": "nq-train_0", "question": "who wrote hamlet?", "golden_answers": ["Shakespeare"],
                    "data_source": "nq"}
    assert b[1]["question"] == "capital of france?" and b[1]["golden_answers"] == ["Paris", "paris city"]
    assert b[0]["id"] == "hotpotqa-0"
    merged = readers.merge(a, b)
    assert len({r["id"] for r in merged}) == 4  # both files use row index 0 and 1: uids still differ
    with pytest.raises(readers.DataError, match="occurs twice"):
        readers.merge(a, a)


def test_flashrag_real_files():
    nq = readers.read_flashrag_jsonl(os.path.join(DATA, "qa", "nq_oracle.jsonl"))
    hp = readers.read_flashrag_jsonl(os.path.join(DATA, "qa", "hotpotqa_sample300.jsonl"))
    assert len(nq) == 2655 and len(hp) == 300
    assert nq[0]["id"] == "nq-oracle-0" and nq[0]["data_source"] == "nq"
    assert all(r["golden_answers"] for r in hp)
    assert len(readers.merge(nq, hp)) == 2955


def test_missing_field_names_file_row_and_field(tmp_path):
    p = tmp_path / "bad.jsonl"
    p.write_text(json.dumps({"id": "a", "question": "q", "golden_answers": ["x"]}) + "\n" +
                 json.dumps({"id": "b", "question": "q2"}) + "\n")
    with pytest.raises(readers.DataError, match=r"bad.jsonl: row 1 has no field 'golden_answers'"):
        readers.read_flashrag_jsonl(str(p))
    with pytest.raises(FileNotFoundError, match="nowhere.jsonl"):
        readers.read_flashrag_jsonl(str(tmp_path / "nowhere.jsonl"))


def test_spider_and_bird_readers_skip_and_count_missing_databases(tmp_path):
    db_root = os.path.join(DATA, "spider", "database")
    spider = [{"db_id": "concert_singer", "question": "How many singers do we have?",
               "query": "SELECT count(*) FROM singer"},
              {"db_id": "wta_1", "question": "How many players?", "query": "SELECT count(*) FROM players"}]
    sp = tmp_path / "dev.json"
    sp.write_text(json.dumps(spider))
    rows, missing = readers.read_spider_json(str(sp), db_root)
    assert missing == 1 and len(rows) == 1
    assert rows[0]["db_path"].endswith("concert_singer/concert_singer.sqlite") and rows[0]["id"] == "spider_dev-0"
    bird = [{"question_id": 7, "db_id": "singer", "question": "q", "evidence": "e", "SQL": "SELECT 1"},
            {"question_id": 8, "db_id": "superhero", "question": "q", "evidence": "", "SQL": "SELECT 1"}]
    bp = tmp_path / "bird.json"
    bp.write_text(json.dumps(bird))
    rows, missing = readers.read_bird_json(str(bp), db_root)
    assert missing == 1 and rows[0]["id"] == "bird_dev-7" and rows[0]["evidence"] == "e"
    sky = tmp_path / "sky.jsonl"
    sky.write_text(json.dumps({"db_id": "pets_1", "question": "How many pets?", "sql": "SELECT count(*) FROM pets"}))
    rows, _ = readers.read_skyrl_sql(str(sky), db_root)
    assert rows[0]["query"] == "SELECT count(*) FROM pets"
    bad = tmp_path / "nosql.json"
    bad.write_text(json.dumps([{"db_id": "pets_1", "question": "q"}]))
    with pytest.raises(readers.DataError, match="no gold SQL"):
        readers.read_spider_json(str(bad), db_root)


def test_load_rows_from_config_entry():
    rows = readers.load_rows({"reader": "flashrag", "path": "data/qa/nq_oracle.jsonl", "offset": 10, "limit": 3},
                             base_dir=os.path.dirname(DATA))
    assert [r["id"] for r in rows] == ["nq-oracle-10", "nq-oracle-11", "nq-oracle-12"]
    with pytest.raises(readers.DataError, match="reader 'csv'"):
        readers.load_rows({"reader": "csv", "path": "x"})


SKYRL_SYSTEM = "You are a data science expert. ... The returned dataframe will be truncated in 50 rows ..."


def _skyrl_row(db_id, data, question, sql, evidence="", newfmt=True, schema="CREATE TABLE x (a int)"):
    """One SkyRL-SQL-653 row as its preprocessing script writes it (newfmt, or the older verl format)."""
    user = "{db_details}:" + schema + ";\n {external_knowledge}: " + evidence + ";\n {question}: " + question
    row = {"data_source": "synsql", "prompt": [{"role": "system", "content": SKYRL_SYSTEM},
                                               {"role": "user", "content": user}],
           "db_id": db_id, "data": data, "extra_info": {"split": "train" if newfmt else "dummy", "index": 0}}
    if newfmt:
        row.update(env_class="text2sql", reward_spec={"method": "rule", "ground_truth": sql})
    else:
        row.update(ability="synsql", reward_model={"style": "rule", "ground_truth": sql})
    return row


def _skyrl_root(tmp_path):
    """SkyRL's db_path layout with the real Spider databases under spider/database (SynSQL and BIRD
    train databases absent)."""
    root = tmp_path / "db_files" / "data"
    (root / "spider").mkdir(parents=True)
    os.symlink(os.path.join(DATA, "spider", "database"), root / "spider" / "database")
    return str(root)


@pytest.mark.parametrize("newfmt", [True, False])
def test_skyrl_sql_653_as_published(tmp_path, newfmt):
    rows = [_skyrl_row("concert_singer", "spider", "How many singers are there?", "SELECT count(*) FROM singer",
                       newfmt=newfmt),
            _skyrl_row("pets_1", "spider", "Average weight of dogs?", "SELECT avg(weight) FROM pets WHERE "
                       "pettype = 'dog'", evidence="dogs are pets with pettype 'dog'", newfmt=newfmt),
            _skyrl_row("synsql_db_17", "synsql", "q", "SELECT 1", newfmt=newfmt),
            _skyrl_row("california_schools", "bird", "q", "SELECT 1", newfmt=newfmt)]
    path = str(tmp_path / "train.parquet")
    pq.write_table(pa.Table.from_pylist(rows), path)
    root = _skyrl_root(tmp_path)
    got, missing = readers.read_skyrl_sql(path, root)
    assert missing == 2  # the SynSQL and BIRD train databases are not under the root: skipped, counted
    assert [r["id"] for r in got] == ["skyrl_sql-0", "skyrl_sql-1"]
    assert got[0]["question"] == "How many singers are there?" and got[0]["evidence"] == ""
    assert got[0]["db_path"] == os.path.join(root, "spider", "database", "concert_singer", "concert_singer.sqlite")
    assert got[1]["evidence"] == "dogs are pets with pettype 'dog'"
    assert got[1]["query"].startswith("SELECT avg(weight)")
    from dart_jax.tools.sqlite_exec import execute
    assert execute(got[0]["db_path"], got[0]["query"]).rows == [(6,)]  # the real database answers the gold
    bad = str(tmp_path / "bad.parquet")
    pq.write_table(pa.Table.from_pylist([dict(rows[0], data="wikisql")]), bad)
    with pytest.raises(readers.DataError, match="data='wikisql'"):
        readers.read_skyrl_sql(bad, root)


def test_skyrl_synsql_path_and_skipped_rows_are_logged(tmp_path, caplog):
    import shutil
    root = tmp_path / "data"
    db = root / "SynSQL-2.5M" / "databases" / "pets_1"
    db.mkdir(parents=True)
    shutil.copy(os.path.join(DATA, "spider", "database", "pets_1", "pets_1.sqlite"), db / "pets_1.sqlite")
    path = tmp_path / "rows.jsonl"
    path.write_text("\n".join(json.dumps(_skyrl_row(d, "synsql", "How many pets?", "SELECT count(*) FROM pets"))
                              for d in ("pets_1", "absent_db")))
    with caplog.at_level("WARNING"):
        got, missing = readers.read_skyrl_sql(str(path), str(root))
    assert missing == 1 and got[0]["db_path"] == str(db / "pets_1.sqlite")
    assert "1 rows skipped: their database is not under the database root" in caplog.text
    assert "absent_db" in caplog.text


def test_training_sources_exclude_every_evaluation_question(tmp_path):
    """A SkyRL-SQL file that contains a Spider dev question (and one from BIRD dev, whose databases are
    not shipped) loses them when the paper config's `exclude` applies."""
    from dart_jax.eval.datasets import exclusion_specs
    dev = next(readers.read_jsonl(os.path.join(DATA, "spider", "dev_questions.jsonl")))
    bird = next(readers.read_jsonl(os.path.join(DATA, "bird", "dev.jsonl")))
    rows = [_skyrl_row(dev["db_id"], "spider", dev["question"], dev["query"]),
            _skyrl_row("concert_singer", "spider", "Name every singer older than 99?", "SELECT name FROM singer "
                       "WHERE age > 99"),
            _skyrl_row(bird["db_id"], "bird", bird["question"], bird["query"])]
    path = str(tmp_path / "train.parquet")
    pq.write_table(pa.Table.from_pylist(rows), path)
    root = _skyrl_root(tmp_path)
    bird_db = os.path.join(root, "bird", "train", "train_databases", bird["db_id"])
    os.makedirs(bird_db)  # a database file for the BIRD row, so only the exclusion can drop it
    import shutil
    shutil.copy(os.path.join(DATA, "spider", "database", "pets_1", "pets_1.sqlite"),
                os.path.join(bird_db, f"{bird['db_id']}.sqlite"))
    spec = {"reader": "skyrl_sql", "path": path, "db_root": root}
    assert len(readers.load_rows(spec)) == 3
    got = readers.load_rows(dict(spec, exclude=exclusion_specs("sql")))
    assert [r["question"] for r in got] == ["Name every singer older than 99?"]
    with pytest.raises(readers.DataError, match="has no path"):
        readers.load_rows(dict(spec, path=""))
