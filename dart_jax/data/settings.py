"""The paper settings' public training files: what each is, how to get it, and the command that
prepares it (`launch.prepare_data`), for the preparer and for every error that names a missing file."""

from __future__ import annotations

import dataclasses
import os

from dart_jax.errors import UserError


@dataclasses.dataclass(frozen=True)
class Setting:
    """A paper setting's public training file: what it is, how to get it, where its config reads it."""
    name: str
    what: str
    download: str        # the command that fetches it into DIR
    out: str             # the folder the paper config reads OUT/train.parquet from
    example: str         # the prepare command, with DIR (and DB) as in `download` (and `databases`)
    databases: str = ""  # sql: the commands that fetch and unpack OmniSQL's databases into DB


SETTINGS = {
    "qa": Setting("qa", "Search-R1's NQ + HotpotQA training set",
                  "hf download PeterJinGo/nq_hotpotqa_train --repo-type dataset --local-dir DIR",
                  "data/nq_hotpotqa_train",
                  "python -m launch.prepare_data qa --input=DIR/train.parquet --out={out}"),
    "sql": Setting("sql", "SkyRL-SQL-653",
                   "hf download NovaSky-AI/SkyRL-SQL-653-data-newfmt --repo-type dataset --local-dir DIR",
                   "data/skyrl_sql",
                   "python -m launch.prepare_data sql --input=DIR/train.parquet --db-root=DB/data --out={out}",
                   "hf download seeklhy/OmniSQL-datasets --repo-type dataset --local-dir DB; unzip DB/data.zip -d DB"),
}


def setting_of(name: str) -> Setting:
    if name not in SETTINGS:
        raise UserError(f"setting {name!r}; expected one of {sorted(SETTINGS)}")
    return SETTINGS[name]


def prepare_hint(setting: str, path: str) -> str:
    """What to run to create `path` (a paper config's training file): one clause for an error line."""
    s = setting_of(setting)
    get = "; ".join(c for c in (s.download, s.databases) if c)
    return f"prepare it with: {s.example.format(out=os.path.dirname(path) or '.')} (get the files first: {get})"
