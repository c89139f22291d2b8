"""Prepare a paper setting's public training file for its config: check it (columns, types, rows),
drop what cannot be trained on (rows with a missing field or empty answers, repeated uids or
questions, questions of every shipped evaluation set, SQL rows whose database is missing) and write
what configs/paper_qa.py or configs/paper_sql.py read. OUT/prepare_report.json counts the rows read
and kept per source and the rows dropped per reason; a short table is printed.

    hf download PeterJinGo/nq_hotpotqa_train --repo-type dataset --local-dir /data/nq_hotpotqa_train
    python -m launch.prepare_data qa --input=/data/nq_hotpotqa_train/train.parquet --out=data/nq_hotpotqa_train

    hf download NovaSky-AI/SkyRL-SQL-653-data-newfmt --repo-type dataset --local-dir /data/skyrl_sql_653
    hf download seeklhy/OmniSQL-datasets --repo-type dataset --local-dir /data/omnisql
    unzip /data/omnisql/data.zip -d /data/omnisql
    python -m launch.prepare_data sql --input=/data/skyrl_sql_653/train.parquet --db-root=/data/omnisql/data \\
        --out=data/skyrl_sql

The SQL rows written carry their database's absolute path, so configs/paper_sql.py needs no
database flag (keep the databases where --db-root says). Running it again on the same input changes
nothing; an OUT holding different rows is kept unless --overwrite.
"""

from __future__ import annotations

from absl import flags

from launch._cli import Command

CLI = Command("launch.prepare_data", __doc__)
F = CLI.flags
INPUT = flags.DEFINE_string("input", None, "the published train.parquet (required)", flag_values=F)
OUT = flags.DEFINE_string("out", None, "the folder to write train.parquet and prepare_report.json into "
                          "(default: where the paper config reads, data/nq_hotpotqa_train or data/skyrl_sql)",
                          flag_values=F)
DB_ROOT = flags.DEFINE_string("db-root", None, "sql: OmniSQL's data/ folder (SynSQL-2.5M/databases, "
                              "spider/database, bird/train/train_databases)", flag_values=F)
OVERWRITE = flags.DEFINE_bool("overwrite", False, "replace an OUT that holds different rows", flag_values=F)


def main(argv: list[str] | None = None) -> int:
    args = CLI.parse(argv)
    from dart_jax.data.prepare import SETTINGS, format_report, prepare
    from dart_jax.errors import UserError
    if len(args) != 1 or args[0] not in SETTINGS:
        raise UserError("name the setting: `launch.prepare_data qa` or `launch.prepare_data sql` "
                        f"(got {args or 'none'})")
    if not INPUT.value:
        raise UserError(f"--input=PATH/train.parquet is required: {SETTINGS[args[0]].what} "
                        f"({SETTINGS[args[0]].download})")
    from dart_jax.eval.datasets import exclusion_specs
    report, status = prepare(args[0], INPUT.value, exclusion_specs(args[0]), OUT.value or "", DB_ROOT.value or "",
                             OVERWRITE.value)
    print(format_report(report, status))
    return 0


if __name__ == "__main__":
    CLI.run(main)
