"""A run's training reward in batch form: response texts + per-row metadata -> scores, and which rows
may enter the update. The texts are a rollout's `reward_text` (rollout.trajectory: observation bodies
blanked, so no passage, SQL cell or column name can earn or cost a reward) and, for QA's retrieval
credit, its `observed` bodies.

    QA:  EM of the response's last <answer> (`em`, DART and Search-R1's main reward) or Search-R1's
         `qa_em_format` partial credit for structure and retrieval (`em_format`).
    SQL: SkyRL-SQL's format check, then the <solution>'s result rows against the gold query's on
         the row's database (`sql_match`: `set`, SkyRL's frozenset comparison, or `spider`, Spider
         EX's: multisets, columns permutable, row order counted when the gold has ORDER BY),
         shaped `paper` (+1 match, −1 otherwise; the paper's NL2SQL reward) or `skyrl` (+1 match,
         0 wrong, −1 format failure). An empty gold result earns nothing unless `reward_empty_gold`.
         Each question's gold result is computed once and cached; a step's queries run in a thread
         pool, each with the per-call deadline of the hardened executor. A gold query that fails or
         times out marks its rows invalid: the prompt leaves the update (counted), the run goes on.
"""

from __future__ import annotations

import dataclasses
import threading
from concurrent.futures import ThreadPoolExecutor

import numpy as np

from dart_jax.rewards.qa import em_format_reward, em_reward
from dart_jax.rewards.sql import (
    SHAPINGS,
    SQL_MATCHES,
    shaped_reward,
    training_outcome,
    verify_format_and_extract,
)
from dart_jax.tools.sqlite_exec import execute

QA_REWARDS = ("em", "em_format")


@dataclasses.dataclass(frozen=True)
class RewardConfig:
    qa: str = "em"
    structure_format_score: float = 0.2   # em_format (Search-R1 qa_em_format defaults)
    final_format_score: float = 0.1
    retrieval_score: float = 0.1
    sql_shaping: str = "paper"
    reward_empty_gold: bool = False
    sql_match: str = "set"                # rewards.sql.SQL_MATCHES: SkyRL's set comparison | Spider EX's
    sql_timeout_s: float = 30.0           # per query (SkyRL-SQL: 30 s for the reward)
    sql_max_rows: int = 100_000
    workers: int = 8

    def __post_init__(self):
        if self.qa not in QA_REWARDS:
            raise ValueError(f"reward.qa={self.qa!r}; expected one of {QA_REWARDS}")
        if self.sql_shaping not in SHAPINGS:
            raise ValueError(f"reward.sql_shaping={self.sql_shaping!r}; expected one of {sorted(SHAPINGS)}")
        if self.sql_match not in SQL_MATCHES:
            raise ValueError(f"reward.sql_match={self.sql_match!r}; expected one of {SQL_MATCHES}")


@dataclasses.dataclass
class Scored:
    scores: np.ndarray   # f32[N]
    valid: np.ndarray    # bool[N]; False: the row's reference is unusable, it leaves the update
    counts: dict         # outcome counts for the metrics


def check_texts(texts: list) -> None:
    """A row without a reward text (a hand-built batch with observations: rollout.trajectory.assemble)
    cannot be scored: refused, never read as its full response."""
    missing = [i for i, t in enumerate(texts) if not isinstance(t, str)]
    if missing:
        raise ValueError(f"rows {missing[:8]} have no reward text (observation bodies must be blanked: "
                         "rollout.trajectory.reward_views)")


class QAReward:
    def __init__(self, rc: RewardConfig = RewardConfig()):
        self.rc = rc

    def one(self, text: str, meta: dict, observed: list[str] | None = None) -> float:
        if self.rc.qa == "em":
            return em_reward(text, meta["golden_answers"])
        return em_format_reward(text, meta["golden_answers"], self.rc.structure_format_score,
                                self.rc.final_format_score, self.rc.retrieval_score, observations=observed)

    def score(self, texts: list[str], metas: list[dict], observed: list[list[str]] | None = None) -> Scored:
        """`texts`: reward texts (`TrajectoryBatch.reward_text`); `observed`: the rows' observation bodies
        (`TrajectoryBatch.observed`), which the em_format retrieval credit reads."""
        check_texts(texts)
        observed = observed if observed is not None else [None] * len(texts)
        scores = np.asarray([self.one(t, m, o) for t, m, o in zip(texts, metas, observed)], np.float32)
        return Scored(scores, np.ones(len(texts), bool), {})


class SQLReward:
    def __init__(self, rc: RewardConfig = RewardConfig()):
        self.rc = rc
        self._gold: dict[tuple[str, str], list[tuple] | str] = {}  # (db, sql) -> rows, or the error
        self._lock = threading.Lock()

    def gold(self, db_path: str, sql: str) -> list[tuple] | str:
        """The gold query's rows (cached per question), or why it cannot serve as a reference."""
        key = (db_path, sql)
        with self._lock:
            if key in self._gold:
                return self._gold[key]
        res = execute(db_path, sql, self.rc.sql_timeout_s, self.rc.sql_max_rows)
        value = res.rows if res.ok and not res.truncated else (res.error or f"more than {self.rc.sql_max_rows} rows")
        if not res.transient:  # a dead or busy worker says nothing about the gold query: ask again next time
            with self._lock:
                self._gold[key] = value
        return value

    def _predict(self, text: str, db_path: str):
        ok, _, solution = verify_format_and_extract(text)
        if not ok:
            return False, None
        res = execute(db_path, solution, self.rc.sql_timeout_s, self.rc.sql_max_rows)
        return True, (res.rows if res.ok and not res.truncated else (res.error or "too many rows"))

    def score(self, texts: list[str], metas: list[dict], observed: list[list[str]] | None = None) -> Scored:
        """`texts`: reward texts (`TrajectoryBatch.reward_text`); `observed` is accepted for the same call
        as QA's and not read (no SQL reward reads observations)."""
        check_texts(texts)
        keys = sorted({(m["db_path"], m["gold_sql"]) for m in metas})
        with ThreadPoolExecutor(max_workers=max(1, self.rc.workers)) as pool:
            golds = dict(zip(keys, pool.map(lambda k: self.gold(*k), keys)))
            preds = list(pool.map(lambda tm: self._predict(tm[0], tm[1]["db_path"]), zip(texts, metas)))
        scores = np.zeros(len(texts), np.float32)
        valid = np.ones(len(texts), bool)
        counts = {"match": 0, "wrong": 0, "format": 0, "empty_gold": 0, "gold_failed": 0}
        for i, (meta, (fmt, pred)) in enumerate(zip(metas, preds)):
            gold = golds[(meta["db_path"], meta["gold_sql"])]
            if isinstance(gold, str):
                valid[i] = False
                counts["gold_failed"] += 1
                continue
            outcome = training_outcome(fmt, pred, gold, self.rc.reward_empty_gold, self.rc.sql_match, meta["gold_sql"])
            counts[outcome] += 1
            counts["empty_gold"] += int(not gold)
            scores[i] = shaped_reward(outcome, self.rc.sql_shaping)
        return Scored(scores, valid, counts)


def make_reward(task: str, rc: RewardConfig = RewardConfig()) -> QAReward | SQLReward:
    if task not in ("qa", "sql"):
        raise ValueError(f"task={task!r}; expected 'qa' or 'sql'")
    return QAReward(rc) if task == "qa" else SQLReward(rc)
