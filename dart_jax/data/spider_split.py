"""The shipped Spider data split by database, for training NL2SQL offline (the SQL quickstart).

Spider's own train / dev split is by database: no dev database is seen in training. The shipped
data hold only dev-side sets (Spider dev and its Spider-Syn / Realistic / DK paraphrases), so the
SQL quickstart splits them the same way: the 20 dev databases sorted by name, alternately to
training and to held-out evaluation. A DK database (`new_<db>`, a modified copy of `<db>`) goes
with its original. `wta_1` (not shipped, 105 MB) lands on the held-out side and is skipped there.

    train   (10 + 2 DK): battle_death, concert_singer, cre_Doc_Template_Mgt, employee_hire_evaluation,
                         museum_visit, orchestra, poker_player, singer, tvshow, world_1,
                         new_concert_singer, new_orchestra
    held out (10 + 1 DK): car_1, course_teach, dog_kennels, flight_2, network_1, pets_1,
                         real_estate_properties, student_transcripts_tracking, voter_1, wta_1, new_pets_1

Spider dev: 493 questions on the training databases, 479 (+ 62 on wta_1) held out. Within the
training side, the warm start and GRPO take disjoint folds of the gold queries (`readers.query_fold`,
a DK copy's questions hashed under their original database), so no gold query is demonstrated to the
warm start and then rewarded in GRPO. Every training entry lists
the held-out side in `exclude` (the same machinery that keeps the paper's evaluation sets out of
training), so a mistake in the database lists drops rows instead of leaking them.
"""

from __future__ import annotations

import os

from dart_jax.data.paths import DATA

_DEV_DBS = ("battle_death", "car_1", "concert_singer", "course_teach", "cre_Doc_Template_Mgt", "dog_kennels",
            "employee_hire_evaluation", "flight_2", "museum_visit", "network_1", "orchestra", "pets_1",
            "poker_player", "real_estate_properties", "singer", "student_transcripts_tracking", "tvshow",
            "voter_1", "world_1", "wta_1")
DK_COPIES = {"new_concert_singer": "concert_singer", "new_orchestra": "orchestra", "new_pets_1": "pets_1"}
_train = set(sorted(_DEV_DBS)[0::2])
TRAIN_DBS = tuple(sorted(_train | {dk for dk, db in DK_COPIES.items() if db in _train}))
HELDOUT_DBS = tuple(sorted(set(_DEV_DBS) - _train | {dk for dk, db in DK_COPIES.items() if db not in _train}))

SPIDER_DB = os.path.join(DATA, "spider", "database")
DK_DB = os.path.join(DATA, "spider", "dk_database")
# (data_source, file) of each shipped Spider-family set
SOURCES = (("spider_dev", "spider/dev_questions.jsonl"), ("spider_syn", "spider/syn_questions.jsonl"),
           ("spider_realistic", "spider/realistic_questions.jsonl"), ("spider_dk", "spider/dk_questions.jsonl"))


def _spec(source: str, path: str, db_ids: tuple[str, ...], side: str) -> dict:
    roots = [DK_DB, SPIDER_DB] if source == "spider_dk" else [SPIDER_DB]
    return dict(reader="spider", path=os.path.join(DATA, path), db_root=roots, data_source=f"{source}_{side}",
                db_ids=list(db_ids))


def heldout_specs(sources: tuple[str, ...] = ("spider_dev",)) -> list[dict]:
    """Dataset entries of the held-out databases' questions (evaluation only)."""
    return [_spec(s, p, HELDOUT_DBS, "heldout") for s, p in SOURCES if s in sources]


def train_specs(fold: int | None = None, folds: int = 2, sources: tuple[str, ...] = tuple(s for s, _ in SOURCES)
                ) -> list[dict]:
    """Dataset entries of the training databases' questions, optionally one gold-query fold of `folds`,
    each excluding every held-out question (all four sets)."""
    out = []
    for s, p in SOURCES:
        if s not in sources:
            continue
        spec = _spec(s, p, TRAIN_DBS, "train")
        if fold is not None:  # a DK copy's questions hash with their original database's
            spec["query_fold"] = [int(fold), int(folds)]
            spec["fold_db_alias"] = dict(DK_COPIES)
        spec["exclude"] = heldout_specs(tuple(x for x, _ in SOURCES))
        out.append(spec)
    return out
