"""Prompt builders on the shipped data: Search-R1 question handling, DDL read from the SQLite file."""

from dart_jax.data.prompts import qa_prompt, schema_ddl, sql_prompt
from dart_jax.rollout.tasks import spider_rows


def test_qa_prompt_question_handling():
    p = qa_prompt("  who wrote war and peace ")
    assert p.endswith("Question: who wrote war and peace?\n")
    assert qa_prompt("is it?").endswith("Question: is it?\n")
    assert "<answer> Beijing </answer>" in p


def test_spider_rows_and_sql_prompt_from_real_database():
    rows = spider_rows(n=3)
    assert rows[0]["db_id"] == "concert_singer" and rows[0]["question"] == "How many singers do we have?"
    assert rows[0]["query"] == "SELECT count(*) FROM singer"
    ddl = schema_ddl(rows[0]["db_path"])
    assert ddl.count("CREATE TABLE") == 4 and "PRIMARY KEY" in ddl and "FOREIGN KEY" in ddl
    prompt = sql_prompt(rows[0]["question"], rows[0]["db_path"])
    assert ddl in prompt and "Question:\nHow many singers do we have?" in prompt
    assert len(spider_rows(n=2000)) == 972  # wta_1 is not shipped
