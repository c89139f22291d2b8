"""schema_ddl opens the database read-only whatever its file name holds (`#`, `?`, `%`)."""

import os
import sqlite3

import pytest

from dart_jax.data.prompts import schema_ddl


@pytest.mark.parametrize("name", ["a#b.sqlite", "a?mode=rwc&x.sqlite", "a%20b.sqlite", "a b.sqlite"])
def test_schema_of_a_database_with_uri_characters_in_its_name(tmp_path, name):
    path = tmp_path / name
    conn = sqlite3.connect(str(path))
    conn.execute("CREATE TABLE marker (id INTEGER PRIMARY KEY, what TEXT)")
    conn.commit()
    conn.close()
    before = sorted(os.listdir(tmp_path))
    assert "CREATE TABLE marker" in schema_ddl(str(path))
    assert sorted(os.listdir(tmp_path)) == before  # nothing created beside it (the unquoted URI made "a")


def test_a_missing_database_is_an_error_and_creates_nothing(tmp_path):
    with pytest.raises(FileNotFoundError):
        schema_ddl(str(tmp_path / "missing#x.sqlite"))
    assert os.listdir(tmp_path) == []
