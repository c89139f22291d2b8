"""Invalid Unicode in dataset rows (issue 49, class 2): valid JSON can carry lone surrogates
("\\ud800"); a question or answer holding one is made valid (each such code point U+FFFD), counted
in a warning, and its prompt tokenizes with the real SmolLM2 tokenizer. Valid text is untouched."""

import json
import logging
import sqlite3

import pytest

from dart_jax.data.readers import load_rows
from dart_jax.data.text import valid_text
from dart_jax.rollout.tasks import qa_task, sql_task
from dart_jax.tokenization.sentinels import add_sentinel_tokens
from dart_jax.tokenization.tokenizer import load_tokenizer

VALID = ["", "plain ascii", "é ß 中文 😀 \ufffd \ue000 \U0010ffff", "tabs\tand\nnewlines", "\x00nul"]


@pytest.fixture(scope="module")
def tok():
    t = load_tokenizer("smollm2-135m-instruct")
    add_sentinel_tokens(t)
    return t


@pytest.mark.parametrize("s", VALID)
def test_valid_text_returns_valid_text_unchanged(s):
    out, n = valid_text(s)
    assert n == 0 and out is s and out.encode("utf-8") == s.encode("utf-8")


def test_valid_text_replaces_each_surrogate_one_for_one():
    s = "a\ud800b\udfff c\ud83d\ude00"  # lone high, lone low, and a pair left as two code points
    out, n = valid_text(s)
    assert n == 4 and len(out) == len(s)
    assert out == "a\ufffdb\ufffd c\ufffd\ufffd"
    out.encode("utf-8")


def _jsonl(path, rows):
    # json.dumps escapes the surrogate as "\ud800": the file is valid UTF-8 and valid JSON
    path.write_text("".join(json.dumps(r) + "\n" for r in rows), encoding="utf-8")
    return str(path)


def test_flashrag_row_with_lone_surrogate_loads_and_its_prompt_tokenizes(tmp_path, tok, caplog):
    path = _jsonl(tmp_path / "qa.jsonl", [
        {"id": "0", "question": "who wrote \ud800 hamlet", "golden_answers": ["Shake\udc00speare", "Will"]},
        {"id": "1", "question": "capital of france é 😀", "golden_answers": ["Paris"]}])
    assert '\\ud800' in open(path).read()
    with caplog.at_level(logging.WARNING, logger="dart_jax.data.readers"):
        rows = load_rows({"reader": "flashrag", "path": path, "data_source": "nq"})
    assert rows[0]["question"] == "who wrote \ufffd hamlet"
    assert rows[0]["golden_answers"] == ["Shake\ufffdspeare", "Will"]
    assert rows[1]["question"] == "capital of france é 😀"  # valid text as it was
    assert any("2 invalid code points" in r.getMessage() and "in 1 rows" in r.getMessage() for r in caplog.records)
    prompts, uids, metas = qa_task(tok, rows)
    assert uids == ["nq-0", "nq-1"] and all(prompts)
    assert "\ufffd hamlet" in tok.decode(prompts[0])


def test_prompt_from_raw_row_with_lone_surrogate_tokenizes(tok, caplog):
    """A row that never went through a reader (rollout.tasks.qa_rows reads jsonl itself): the
    tokenizer boundary (`encode_text`) makes it valid too, and counts it."""
    rows = [{"id": "x", "question": "who \ud800 wrote hamlet", "golden_answers": ["a"]}]
    with caplog.at_level(logging.WARNING, logger="dart_jax.tokenization.tokenizer"):
        prompts, _, _ = qa_task(tok, rows)
    assert "who \ufffd wrote hamlet" in tok.decode(prompts[0])
    assert any("1 invalid code points" in r.getMessage() for r in caplog.records)


def test_sql_row_with_lone_surrogate_in_question_and_evidence_tokenizes(tmp_path, tok):
    db_dir = tmp_path / "db" / "d1"
    db_dir.mkdir(parents=True)
    conn = sqlite3.connect(db_dir / "d1.sqlite")
    conn.execute("CREATE TABLE t (a INTEGER)")
    conn.commit()
    conn.close()
    path = _jsonl(tmp_path / "bird.jsonl", [{"question_id": 0, "db_id": "d1", "question": "how many \udbff rows",
                                             "evidence": "ev \ud800", "SQL": "SELECT count(*) FROM t"}])
    rows = load_rows({"reader": "bird", "path": path, "db_root": str(tmp_path / "db")})
    assert rows[0]["question"] == "how many \ufffd rows" and rows[0]["evidence"] == "ev \ufffd"
    prompts, _, _ = sql_task(tok, rows)
    assert "how many \ufffd rows" in tok.decode(prompts[0])
