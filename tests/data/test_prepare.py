"""launch.prepare_data on stand-ins of the public training files in their published formats
(tests/standins/datasets.py): each fixture row is written to be kept or dropped for one reason, so
the counts below are worked out by hand; the output is read back by the paper config's own reader."""

import json
import os
import sqlite3

import pyarrow.parquet as pq
import pytest

from configs import paper_qa, paper_sql
from dart_jax.data import prepare
from dart_jax.data.paths import DATA
from dart_jax.data.readers import read_jsonl
from dart_jax.errors import UserError
from dart_jax.eval.datasets import exclusion_specs
from dart_jax.run.spec import run_spec
from dart_jax.run.task import load_task_rows
from launch import prepare_data
from standins.datasets import (
    SAMPLE_SQL,
    SEARCH_R1_SCHEMA,
    SKYRL_SCHEMA,
    omnisql_db_root,
    sample_search_r1_train,
    sample_skyrl_sql,
    search_r1_row,
    skyrl_sql_row,
    write_search_r1_train,
    write_skyrl_sql_653,
)

NQ_EVAL = next(read_jsonl(os.path.join(DATA, "qa", "nq_test_sample1000.jsonl")))            # in the nq eval set
HOTPOT_EVAL = next(read_jsonl(os.path.join(DATA, "qa", "hotpotqa_dev1000.jsonl")))          # in the hotpotqa set
SPIDER_EVAL = next(read_jsonl(os.path.join(DATA, "spider", "dev_questions.jsonl")))         # in spider_dev


def _qa_rows() -> list[dict]:
    hp = {"type": "comparison", "level": "medium"}
    return [
        search_r1_row("nq", 0, "who wrote hamlet", ["William Shakespeare", "Shakespeare"]),         # kept
        search_r1_row("nq", 1, NQ_EVAL["question"], NQ_EVAL["golden_answers"]),                     # evaluation (nq)
        search_r1_row("nq", 2, "when did the eiffel tower open", None),                             # missing answers
        search_r1_row("nq", 3, "who painted the mona lisa", []),                                    # empty answers
        search_r1_row("nq", 4, "what is the capital of peru", ["the"]),          # blank once normalised: empty
        search_r1_row("nq", 5, "how many legs does a spider have", ["eight"], id="train_0"),        # duplicate uid
        search_r1_row("nq", 6, "Who wrote Hamlet", ["Shakespeare"]),                                # duplicate question
        search_r1_row("nq", 7, "what is the boiling point of water at sea level", ["100 °C"]),      # kept
        search_r1_row("hotpotqa", 0, "Which magazine was started first, Arthur's Magazine or First for Women",
                      ["Arthur's Magazine"], id="5a7a06935542990198eaf050", metadata=hp),           # kept
        search_r1_row("hotpotqa", 1, HOTPOT_EVAL["question"], HOTPOT_EVAL["golden_answers"],
                      id="5a8b57f25542995d1e6f1371", metadata=hp),                                   # evaluation
        dict(search_r1_row("hotpotqa", 2, "who directed jaws", ["Steven Spielberg"], id="5a8c7595554299585d9e36b6"),
             data_source=None),                                                                     # missing source
        search_r1_row("hotpotqa", 3, "Who was born first, Ada Lovelace or Charles Babbage", ["Charles Babbage"],
                      id="5a85ea095542994775f606a8", metadata=hp),                                  # kept
    ]


QA_KEPT = [0, 7, 8, 11]


def test_qa_counts_drop_reasons_and_published_columns(tmp_path):
    rows = _qa_rows()
    src = write_search_r1_train(str(tmp_path / "hf" / "train.parquet"), rows)
    out = str(tmp_path / "nq_hotpotqa_train")
    report, status = prepare.prepare("qa", src, exclusion_specs("qa"), out)
    assert status == "written"
    assert report["rows_read"] == 12 and report["rows_kept"] == 4
    assert report["by_source"] == {"(none)": {"read": 1, "kept": 0}, "hotpotqa": {"read": 3, "kept": 2},
                                   "nq": {"read": 8, "kept": 2}}
    assert report["dropped"] == {"duplicate question": 1, "duplicate uid": 1, "empty answers": 2,
                                 "evaluation question": 2, "missing answers": 1, "missing data_source": 1}
    assert report["excluded_by_set"] == {"hotpotqa": 1, "nq": 1}
    assert report["examples"]["duplicate uid"] == ["row 5 (nq): uid 'nq-train_0' repeats an earlier row"]
    with open(os.path.join(out, "prepare_report.json")) as f:
        assert json.load(f) == report
    # the kept rows, unchanged, with every published column (HotpotQA's metadata included)
    table = pq.read_table(os.path.join(out, "train.parquet"))
    assert table.schema.equals(SEARCH_R1_SCHEMA)
    written = write_search_r1_train(str(tmp_path / "expected.parquet"), [rows[k] for k in QA_KEPT])
    assert table.to_pylist() == pq.read_table(written).to_pylist()


def test_qa_output_is_what_the_paper_config_reads(tmp_path):
    src = write_search_r1_train(str(tmp_path / "hf" / "train.parquet"), _qa_rows())
    out = str(tmp_path / "nq_hotpotqa_train")
    prepare.prepare("qa", src, exclusion_specs("qa"), out)
    c = paper_qa.get_config("dart,qwen2.5-3b-base")
    c.data.train = [dict(c.data.train[0], path=os.path.join(out, "train.parquet"))]
    got = load_task_rows(run_spec(c))
    assert got == [
        {"id": "nq-train_0", "question": "who wrote hamlet?", "golden_answers": ["William Shakespeare", "Shakespeare"],
         "data_source": "nq"},
        {"id": "nq-train_7", "question": "what is the boiling point of water at sea level?",
         "golden_answers": ["100 °C"], "data_source": "nq"},
        {"id": "hotpotqa-5a7a06935542990198eaf050",
         "question": "Which magazine was started first, Arthur's Magazine or First for Women?",
         "golden_answers": ["Arthur's Magazine"], "data_source": "hotpotqa"},
        {"id": "hotpotqa-5a85ea095542994775f606a8", "question": "Who was born first, Ada Lovelace or Charles Babbage?",
         "golden_answers": ["Charles Babbage"], "data_source": "hotpotqa"}]


def test_idempotent_and_refuses_a_different_output(tmp_path):
    rows = _qa_rows()
    src = write_search_r1_train(str(tmp_path / "a.parquet"), rows)
    out = str(tmp_path / "out")
    assert prepare.prepare("qa", src, exclusion_specs("qa"), out)[1] == "written"
    before = open(os.path.join(out, "train.parquet"), "rb").read()
    assert prepare.prepare("qa", src, exclusion_specs("qa"), out)[1] == "unchanged"
    assert open(os.path.join(out, "train.parquet"), "rb").read() == before
    other = write_search_r1_train(str(tmp_path / "b.parquet"), rows[:8])
    with pytest.raises(UserError, match=r"already holds different rows \(prepared from .*a\.parquet\); pass "
                                        r"--overwrite"):
        prepare.prepare("qa", other, exclusion_specs("qa"), out)
    assert open(os.path.join(out, "train.parquet"), "rb").read() == before
    report, status = prepare.prepare("qa", other, exclusion_specs("qa"), out, overwrite=True)
    assert status == "written" and report["rows_kept"] == 2
    assert pq.read_table(os.path.join(out, "train.parquet")).num_rows == 2


def _sql_fixture(tmp_path):
    root = omnisql_db_root(str(tmp_path / "omnisql" / "data"))
    broken = os.path.join(root, "SynSQL-2.5M", "databases", "synsql_lfs")
    os.makedirs(broken)
    with open(os.path.join(broken, "synsql_lfs.sqlite"), "w") as f:  # a Git LFS pointer, not the database
        f.write("version https://git-lfs.github.com/spec/v1\noid sha256:0\nsize 1\n")
    rows = [
        skyrl_sql_row("concert_singer", "spider", "How many singers are there in total?",
                      "SELECT count(*) FROM singer"),                                                # kept
        skyrl_sql_row("pets_1", "spider", "What is the average weight of all dogs?",
                      "SELECT avg(weight) FROM pets WHERE pettype = 'dog'", evidence="dogs: pettype 'dog'"),  # kept
        skyrl_sql_row(SPIDER_EVAL["db_id"], "spider", SPIDER_EVAL["question"], SPIDER_EVAL["query"]),  # evaluation
        skyrl_sql_row("synsql_shop", "synsql", "How many products cost more than 10?",
                      "SELECT count(*) FROM products WHERE price > 10"),                              # kept
        skyrl_sql_row("synsql_absent", "synsql", "How many orders are there?", "SELECT count(*) FROM orders"),  # no db
        skyrl_sql_row("synsql_shop", "synsql", "What is the cheapest product?", None),                # no gold SQL
        skyrl_sql_row("concert_singer", "spider", "how many singers are there in total",
                      "SELECT count(*) FROM singer"),                                                 # duplicate
        skyrl_sql_row("california_schools", "bird", "How many schools are there?",
                      "SELECT count(*) FROM schools"),                                                # no db
        skyrl_sql_row("synsql_lfs", "synsql", "How many lines are there?", "SELECT count(*) FROM lines"),  # not SQLite
    ]
    return write_skyrl_sql_653(str(tmp_path / "hf" / "train.parquet"), rows), root, rows


def test_sql_counts_drop_reasons_and_database_paths(tmp_path):
    src, root, rows = _sql_fixture(tmp_path)
    out = str(tmp_path / "skyrl_sql")
    report, status = prepare.prepare("sql", src, exclusion_specs("sql"), out, db_root=root)
    assert status == "written" and report["db_root"] == os.path.abspath(root)
    assert report["rows_read"] == 9 and report["rows_kept"] == 3
    assert report["by_source"] == {"bird": {"read": 1, "kept": 0}, "spider": {"read": 4, "kept": 2},
                                   "synsql": {"read": 4, "kept": 1}}
    assert report["dropped"] == {"database missing": 2, "database not SQLite": 1, "duplicate question": 1,
                                 "evaluation question": 1, "missing gold SQL": 1}
    assert report["excluded_by_set"] == {"spider_dev": 1}
    assert report["examples"]["missing gold SQL"] == [
        "row 5 (synsql): has no gold SQL (reward_spec.ground_truth, reward_model.ground_truth or sql)"]
    table = pq.read_table(os.path.join(out, "train.parquet"))
    assert table.schema.names == SKYRL_SCHEMA.names + ["db_path"]
    kept = table.to_pylist()
    assert [{k: v for k, v in r.items() if k != "db_path"} for r in kept] == [rows[0], rows[1], rows[3]]
    assert [r["db_path"] for r in kept] == [
        os.path.join(os.path.abspath(root), "spider", "database", "concert_singer", "concert_singer.sqlite"),
        os.path.join(os.path.abspath(root), "spider", "database", "pets_1", "pets_1.sqlite"),
        os.path.join(os.path.abspath(root), "SynSQL-2.5M", "databases", "synsql_shop", "synsql_shop.sqlite")]


def test_sql_output_is_what_the_paper_config_reads_without_a_db_root(tmp_path):
    src, root, _ = _sql_fixture(tmp_path)
    out = str(tmp_path / "skyrl_sql")
    prepare.prepare("sql", src, exclusion_specs("sql"), out, db_root=root)
    c = paper_sql.get_config("dart")
    spec = dict(c.data.train[0])
    assert spec["path"] == "data/skyrl_sql/train.parquet" and spec["db_root"] == "" and spec["prepare"] == "sql"
    c.data.train = [dict(spec, path=os.path.join(out, "train.parquet"))]
    got = load_task_rows(run_spec(c))
    assert [(r["id"], r["question"], r["db_id"], r["evidence"]) for r in got] == [
        ("skyrl_sql-0", "How many singers are there in total?", "concert_singer", ""),
        ("skyrl_sql-1", "What is the average weight of all dogs?", "pets_1", "dogs: pettype 'dog'"),
        ("skyrl_sql-2", "How many products cost more than 10?", "synsql_shop", "")]
    # the databases the rows name are the real ones: their gold queries answer as sqlite3 says
    results = [sqlite3.connect(r["db_path"]).execute(r["query"]).fetchall() for r in got]
    assert results[0] == [(6,)] and results[2] == [(2,)]
    assert results[1][0][0] == pytest.approx(sqlite3.connect(os.path.join(DATA, "spider", "database", "pets_1",
                                                                          "pets_1.sqlite")).execute(
        "SELECT avg(weight) FROM pets WHERE pettype = 'dog'").fetchone()[0])


def test_sql_needs_its_database_root(tmp_path):
    src, _, _ = _sql_fixture(tmp_path)
    with pytest.raises(UserError, match="sql needs --db-root"):
        prepare.prepare("sql", src, exclusion_specs("sql"), str(tmp_path / "o"))
    with pytest.raises(FileNotFoundError, match="database root .*nowhere not found; it is OmniSQL's data/ folder"):
        prepare.prepare("sql", src, exclusion_specs("sql"), str(tmp_path / "o"), db_root=str(tmp_path / "nowhere"))
    empty = tmp_path / "empty"
    empty.mkdir()
    with pytest.raises(UserError, match=r"no database of .* is under .*empty: all 7 rows checked miss theirs "
                                        r"\(e\.g\. row 0 \(spider\): .*--db-root is OmniSQL's"):
        prepare.prepare("sql", src, exclusion_specs("sql"), str(tmp_path / "o"), db_root=str(empty))
    assert not (tmp_path / "o").exists()


def test_published_schema_is_checked(tmp_path):
    import pyarrow as pa
    missing = str(tmp_path / "nowhere" / "train.parquet")
    with pytest.raises(FileNotFoundError) as e:
        prepare.prepare("qa", missing, exclusion_specs("qa"), str(tmp_path / "o"))
    assert str(e.value).endswith("get Search-R1's NQ + HotpotQA training set with: hf download "
                                 f"PeterJinGo/nq_hotpotqa_train --repo-type dataset --local-dir {tmp_path / 'nowhere'}")
    text = tmp_path / "train.parquet"
    text.write_text("id,question\n")
    with pytest.raises(UserError, match="is not a parquet file"):
        prepare.prepare("qa", str(text), str(tmp_path / "o"))
    bare = str(tmp_path / "bare.parquet")
    pq.write_table(pa.table({"question": ["q?"], "golden_answers": [7]}), bare)
    with pytest.raises(UserError, match=r"bare.parquet: no column 'data_source'; column 'golden_answers' is int64, "
                                        r"expected list<string> \(columns: question, golden_answers\)"):
        prepare.prepare("qa", bare, exclusion_specs("qa"), str(tmp_path / "o"))
    sql, _, _ = _sql_fixture(tmp_path)
    with pytest.raises(UserError, match="it is a SQL training file; prepare it with `python -m launch.prepare_data"):
        prepare.prepare("qa", sql, exclusion_specs("qa"), str(tmp_path / "o"))
    qa = write_search_r1_train(str(tmp_path / "qa.parquet"), _qa_rows())
    with pytest.raises(UserError, match="it is a QA training file"):
        prepare.prepare("sql", qa, exclusion_specs("sql"), str(tmp_path / "o"), db_root=str(tmp_path))


def test_missing_training_file_names_the_prepare_command(tmp_path):
    """The paper configs read what launch.prepare_data writes; without it, one line says how to make it."""
    c = paper_qa.get_config("dart,qwen2.5-3b-base")
    spec = dict(c.data.train[0])
    assert spec["path"] == "data/nq_hotpotqa_train/train.parquet" and spec["prepare"] == "qa"
    path = str(tmp_path / "nq_hotpotqa_train" / "train.parquet")
    c.data.train = [dict(spec, path=path)]
    with pytest.raises(FileNotFoundError) as e:
        load_task_rows(run_spec(c))
    msg = str(e.value)
    assert "\n" not in msg
    assert msg.startswith(f"dataset file {path} not found; prepare it with: python -m launch.prepare_data qa "
                          f"--input=DIR/train.parquet --out={tmp_path / 'nq_hotpotqa_train'} ")
    assert "hf download PeterJinGo/nq_hotpotqa_train --repo-type dataset --local-dir DIR" in msg
    s = paper_sql.get_config("lora")
    path = str(tmp_path / "skyrl_sql" / "train.parquet")
    s.data.train = [dict(s.data.train[0], path=path)]
    with pytest.raises(FileNotFoundError, match=r"prepare it with: python -m launch\.prepare_data sql "
                                                r"--input=DIR/train\.parquet --db-root=DB/data --out=.*skyrl_sql "
                                                r"\(get the files first: hf download "
                                                r"NovaSky-AI/SkyRL-SQL-653-data-newfmt "
                                                r"--repo-type dataset --local-dir DIR; hf download "
                                                r"seeklhy/OmniSQL-datasets "
                                                r"--repo-type dataset --local-dir DB; unzip DB/data\.zip -d DB\)$"):
        load_task_rows(run_spec(s))


def test_command_prints_the_table_and_reports_mistakes_in_one_line(tmp_path, capsys):
    src = write_search_r1_train(str(tmp_path / "train.parquet"), _qa_rows())
    out = str(tmp_path / "out")
    assert prepare_data.main(["qa", f"--input={src}", f"--out={out}"]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert lines[0] == f"qa: 12 rows read from {src}"
    assert [line.split() for line in lines[2:6]] == [["(none)", "1", "0"], ["hotpotqa", "3", "2"], ["nq", "8", "2"],
                                                      ["total", "12", "4"]]
    assert "evaluation question 2 (hotpotqa 1, nq 1)" in " ".join(" ".join(lines).split())
    assert lines[-1] == f"wrote {os.path.join(out, 'train.parquet')} (4 rows) and its prepare_report.json"
    assert prepare_data.main(["qa", f"--input={src}", f"--out={out}"]) == 0
    assert capsys.readouterr().out.splitlines()[-1].startswith("unchanged: ")
    with pytest.raises(SystemExit) as e:
        prepare_data.CLI.run(prepare_data.main, ["qa", f"--input={tmp_path / 'none.parquet'}", f"--out={out}"])
    assert e.value.code == 2
    err = capsys.readouterr().err.strip()
    assert err.count("\n") == 0 and err.startswith("launch.prepare_data: input file ") and "hf download" in err
    with pytest.raises(SystemExit) as e:
        prepare_data.CLI.run(prepare_data.main, ["tsv", f"--input={src}"])
    assert e.value.code == 2 and "launch.prepare_data qa` or `launch.prepare_data sql" in capsys.readouterr().err


def test_rehearsal_samples_are_kept_whole(tmp_path):
    """The stand-ins the recipe rehearsals prepare: every row survives, every gold query runs."""
    qa = sample_search_r1_train(str(tmp_path / "qa" / "train.parquet"), n_nq=3, n_hotpot=2)
    report, _ = prepare.prepare("qa", qa, exclusion_specs("qa"), str(tmp_path / "nq_hotpotqa_train"))
    assert report["by_source"] == {"hotpotqa": {"read": 2, "kept": 2}, "nq": {"read": 3, "kept": 3}}
    sql, root = sample_skyrl_sql(str(tmp_path / "sql" / "train.parquet"), str(tmp_path / "omnisql" / "data"))
    report, _ = prepare.prepare("sql", sql, exclusion_specs("sql"), str(tmp_path / "skyrl_sql"), db_root=root)
    assert report["rows_kept"] == report["rows_read"] == len(SAMPLE_SQL) and not report["dropped"]
    table = pq.read_table(str(tmp_path / "skyrl_sql" / "train.parquet")).to_pylist()
    for row in table:
        assert sqlite3.connect(row["db_path"]).execute(row["reward_spec"]["ground_truth"]).fetchall()
