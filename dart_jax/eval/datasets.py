"""The evaluation sets of the paper (its results tables), by name, on the slices shipped in data/.

QA: EM per data source; Gen-Avg over the general sets (NQ, TriviaQA, PopQA), MH-Avg over the
multi-hop sets (HotpotQA, 2Wiki, MuSiQue, Bamboogle), Avg over all seven.
SQL: EX per benchmark, test-suite semantics for the Spider family, BIRD semantics for BIRD; Avg
over the benchmarks evaluated. BIRD's databases are not shipped: `db_root` (launch.evaluate
--db-root DIR, with DIR/<db_id>/<db_id>.sqlite) supplies them.
Lab (dart_jax/lab): questions of a generated world, selected by (hops, op) cell, each answerable only
over its own world's corpus: a set names that `corpus`, and the evaluation searches it for that set.
"""

from __future__ import annotations

import dataclasses
import os

from dart_jax.data.paths import DATA
from dart_jax.data.readers import READERS, drop_missing_db, load_rows, select_rows
from dart_jax.data.spider_split import HELDOUT_DBS, TRAIN_DBS


@dataclasses.dataclass(frozen=True)
class EvalSet:
    name: str
    task: str                 # qa | sql
    label: str                # column name in the tables (the paper's)
    reader: str
    path: str                 # relative to data/ (or absolute)
    group: str = ""           # qa: general | multihop | lab
    db_root: tuple[str, ...] = ()
    semantics: str = "spider"  # sql: spider | bird
    needs_db_root: bool = False
    note: str = ""
    db_ids: tuple[str, ...] | None = None  # only these databases' questions (the SQL quickstart's split)
    offset: int = 0                    # rows [offset, …) of the file, after `exclude` (QA only)
    exclude: tuple[str, ...] = ()      # names of evaluation sets whose questions are removed first
    max_hardness: str = ""             # sql: only gold queries Spider grades at most this (data.sql_hardness)
    query_fold: tuple[int, int] | None = None  # sql: only gold queries of fold i of k (readers.query_fold)
    in_distribution: bool = False      # a run's own training questions: reported, never averaged with held-out sets
    corpus: str = ""                   # qa: the corpus (relative to data/, or absolute) this set is searched over,
    #                                    in place of the run's retriever (a lab world's questions: its own world)
    lab_hops: tuple[int, ...] | None = None  # lab: only questions of these hops (readers.select_rows) ...
    lab_ops: tuple[str, ...] | None = None   # ... and of these operations (None: every one)
    ids: tuple[str, ...] | None = None       # qa: only these questions, in this order (a CEA screen's selection)

    def corpus_path(self) -> str:
        """The absolute path of `corpus` ("" when the set is searched with the run's retriever)."""
        return self.corpus if not self.corpus or os.path.isabs(self.corpus) else os.path.join(DATA, self.corpus)

    def _cells(self, spec: dict) -> dict:
        if self.lab_hops is not None:
            spec["lab_hops"] = list(self.lab_hops)
        if self.lab_ops is not None:
            spec["lab_ops"] = list(self.lab_ops)
        return spec

    def exclusion_spec(self) -> dict:
        """This set as a `readers.load_rows` entry for `exclude` (questions only, databases not needed):
        a training source listing it never trains on these questions."""
        spec = {"reader": self.reader, "path": os.path.join(DATA, self.path), "data_source": self.name}
        if self.offset:
            spec["offset"] = int(self.offset)
        if self.exclude:
            spec["exclude"] = [EVAL_SETS[n].exclusion_spec() for n in self.exclude]
        if self.task == "sql":
            spec["db_root"] = [os.path.join(DATA, r) for r in self.db_root]
        if self.db_ids is not None:
            spec["db_ids"] = list(self.db_ids)
        if self.query_fold is not None:
            spec["query_fold"] = list(self.query_fold)
        return self._cells(spec)

    def spec(self, db_root: str | None = None, limit: int | None = None) -> dict:
        """The dataset entry for `readers.load_rows`."""
        if self.task == "sql" and self.needs_db_root and not db_root:
            raise FileNotFoundError(f"{self.name}: its databases are not shipped ({self.note}); pass --db-root DIR "
                                    "with DIR/<db_id>/<db_id>.sqlite")
        spec = {"reader": self.reader, "path": self.path, "data_source": self.name}
        if self.task == "sql":
            spec["db_root"] = list(([db_root] if db_root else []) + list(self.db_root))
        if self.db_ids is not None:
            spec["db_ids"] = list(self.db_ids)
        if self.max_hardness:
            spec["max_hardness"] = self.max_hardness
        if self.query_fold is not None:
            spec["query_fold"] = list(self.query_fold)
        if self.offset:
            spec["offset"] = int(self.offset)
        if self.exclude:
            spec["exclude"] = [EVAL_SETS[n].exclusion_spec() for n in self.exclude]
        if limit:
            spec["limit"] = int(limit)
        return self._cells(spec)


QA_SETS = (
    EvalSet("nq", "qa", "NQ", "flashrag", "qa/nq_test_sample1000.jsonl", "general"),
    EvalSet("triviaqa", "qa", "TriviaQA", "flashrag", "qa/triviaqa_test_sample1000.jsonl", "general"),
    EvalSet("popqa", "qa", "PopQA", "flashrag", "qa/popqa_test_sample1000.jsonl", "general"),
    EvalSet("hotpotqa", "qa", "HotpotQA", "flashrag", "qa/hotpotqa_dev1000.jsonl", "multihop"),
    EvalSet("2wiki", "qa", "2Wiki", "flashrag", "qa/2wiki_dev1000.jsonl", "multihop"),
    EvalSet("musique", "qa", "MuSiQue", "flashrag", "qa/musique_dev1000.jsonl", "multihop"),
    EvalSet("bamboogle", "qa", "Bamboogle", "flashrag", "qa/bamboogle_test.jsonl", "multihop"),
)
SPIDER_DB = ("spider/database",)
SQL_SETS = (
    EvalSet("spider_dev", "sql", "Spider-dev", "spider", "spider/dev_questions.jsonl", db_root=SPIDER_DB),
    EvalSet("spider_dk", "sql", "Spider-DK", "spider", "spider/dk_questions.jsonl",
            db_root=("spider/dk_database",) + SPIDER_DB),
    EvalSet("spider_realistic", "sql", "Spider-Realistic", "spider", "spider/realistic_questions.jsonl",
            db_root=SPIDER_DB),
    EvalSet("spider_syn", "sql", "Spider-Syn", "spider", "spider/syn_questions.jsonl", db_root=SPIDER_DB),
    EvalSet("bird_dev", "sql", "BIRD-dev", "bird", "bird/dev.jsonl", semantics="bird", needs_db_root=True,
            note="BIRD dev databases, 1.4 GB"),
    EvalSet("bird_mini_dev", "sql", "BIRD-mini-dev", "bird", "bird/mini_dev.jsonl", semantics="bird",
            needs_db_root=True, note="BIRD dev databases, 1.4 GB"),
)
# the held-out side of the shipped Spider split by database (dart_jax/data/spider_split.py): what the SQL
# quickstart, which trains on the other databases, is evaluated on
HELDOUT_SETS = tuple(dataclasses.replace(s, name=f"{s.name}_heldout", label=f"{s.label} (held-out dbs)",
                                         db_ids=HELDOUT_DBS) for s in SQL_SETS if s.name.startswith("spider"))
# its easy-graded questions (Spider hardness): where the SQL quickstart's GRPO, which trains on easy questions,
# should show first (108 Spider dev questions)
HELDOUT_SETS += (dataclasses.replace(HELDOUT_SETS[0], name="spider_dev_heldout_easy",
                                     label="Spider-dev (held-out dbs, easy)", max_hardness="easy"),)
# the SQL quickstart's own GRPO questions, Spider dev phrasing: training databases, gold-query fold 1 (the
# warm start saw fold 0), easy. In-distribution — whether GRPO fits what it trains on, not whether it
# generalises; never an exclusion source (it *is* training data)
TRAIN_SETS = (dataclasses.replace(SQL_SETS[0], name="spider_dev_train_easy",
                                  label="Spider-dev (GRPO training questions, easy)", db_ids=TRAIN_DBS,
                                  max_hardness="easy", query_fold=(1, 2), in_distribution=True),)
# questions whose evidence is in the shipped corpus, for studies on the embedded default (CEA's quickstart):
# nq_oracle rows after the quickstart's GRPO prompts (the first 1,024 eligible) and its warm-start
# demonstrations (the next 640), with the NQ evaluation slice removed — never trained on; and the HotpotQA
# questions whose ten paragraphs are in the corpus (a study holds out the first N and trains on the rest)
CORPUS_SETS = (
    EvalSet("nq_corpus_heldout", "qa", "NQ (corpus, held-out)", "flashrag", "qa/nq_oracle.jsonl", "general",
            offset=1024 + 640, exclude=("nq",), note="253 questions"),
    EvalSet("hotpotqa_corpus", "qa", "HotpotQA (corpus)", "flashrag", "qa/hotpotqa_sample300.jsonl", "multihop",
            note="300 questions"),
)
# the lab (dart_jax/lab, launch.lab_build): world 1 is held out (never trained on), its RL difficulty is
# h ≥ 2 (docs/results/lab.md: one hop is answered by copying the question into the search); world 0 is
# the training world (in-distribution). Each is searched over its own world's corpus.
LAB_WORLD1 = EvalSet("lab_world1", "qa", "Lab world 1 (h2-3)", "flashrag", "lab/world1/questions.jsonl", "lab",
                     corpus="lab/world1/corpus.jsonl", lab_hops=(2, 3), note="held-out world, 1,200 questions")
LAB_SETS = (
    LAB_WORLD1,
    dataclasses.replace(LAB_WORLD1, name="lab_world1_easy", label="Lab world 1 (h1)", lab_hops=(1,),
                        note="held-out world, 600 questions"),
    dataclasses.replace(LAB_WORLD1, name="lab_world0", label="Lab world 0 (h2-3, training world)",
                        path="lab/world0/questions.jsonl", corpus="lab/world0/corpus.jsonl", in_distribution=True,
                        note="training world, 1,200 questions"),
)
EVAL_SETS = {s.name: s for s in QA_SETS + SQL_SETS + HELDOUT_SETS + TRAIN_SETS + CORPUS_SETS + LAB_SETS}
GROUPS = {"Gen-Avg": ("nq", "triviaqa", "popqa"), "MH-Avg": ("hotpotqa", "2wiki", "musique", "bamboogle"),
          "Avg": tuple(s.name for s in QA_SETS)}


def exclusion_specs(task: str) -> list[dict]:
    """Every shipped evaluation set of `task`, as `exclude` entries for training sources."""
    return [s.exclusion_spec() for s in (QA_SETS if task == "qa" else SQL_SETS)]


def default_sets(task: str, db_root: str | None = None) -> list[str]:
    """Every set of the task that can run here (BIRD only with a database root)."""
    sets = QA_SETS if task == "qa" else SQL_SETS
    return [s.name for s in sets if not s.needs_db_root or db_root]


def resolve(names: list[str], task: str) -> list[EvalSet]:
    """Sets by name (or EvalSet objects, passed through: a set narrowed by a study, e.g. to screened ids)."""
    out = []
    for name in names:
        if isinstance(name, EvalSet):
            s, name = name, name.name
        elif name not in EVAL_SETS:
            raise ValueError(f"unknown dataset {name!r}; known: {sorted(EVAL_SETS)}")
        else:
            s = EVAL_SETS[name]
        if s.task != task:
            raise ValueError(f"dataset {name!r} is a {s.task} set but the task is {task!r} (--task {s.task})")
        out.append(s)
    return out


def interleave_cells(rows: list[dict]) -> list[dict]:
    """Lab rows in turns over their (hops, op) cells (sorted), each cell's rows in file order: a file is
    written cell by cell, so its first N questions would be one cell; these first N span every cell."""
    cells: dict = {}
    for r in rows:
        cells.setdefault((int(r["lab"]["hops"]), str(r["lab"]["op"])), []).append(r)
    turns = [cells[k] for k in sorted(cells)]
    return [c[i] for i in range(max(map(len, turns), default=0)) for c in turns if i < len(c)]


def ids_digest(ids) -> str:
    """A short digest of a selection of question ids (its count and order included)."""
    import hashlib
    return f"{len(ids)}:" + hashlib.sha256("\n".join(map(str, ids)).encode()).hexdigest()[:16]


def select_ids(rows: list[dict], ids, name: str) -> list[dict]:
    """The rows with these question ids, in the order of `ids` (each must be among `rows`)."""
    by_id = {str(r["id"]): r for r in rows}
    missing = [i for i in ids if str(i) not in by_id]
    if missing:
        raise ValueError(f"{name}: {len(missing)} selected question ids are not among its {len(rows)} questions "
                         f"(e.g. {missing[:3]}): the selection was made on another set")
    return [by_id[str(i)] for i in ids]


def load_set(s: EvalSet, limit: int | None = None, db_root: str | None = None) -> tuple[list[dict], dict]:
    """-> (rows, counts). SQL rows whose database is absent are skipped and counted (never scored 0)."""
    spec = s.spec(db_root, None)
    if s.task == "qa":
        rows = load_rows(spec, base_dir=DATA)
        rows = interleave_cells(rows) if s.lab_hops is not None or s.lab_ops is not None else rows
        rows = select_ids(rows, s.ids, s.name) if s.ids is not None else rows
        rows = rows[:limit] if limit else rows
        return rows, {"questions": len(rows), "skipped_no_db": 0}
    if s.ids is not None:
        raise ValueError(f"{s.name}: a selection of question ids applies to QA sets only")
    roots = [r if os.path.isabs(r) or os.path.exists(r) else os.path.join(DATA, r) for r in spec["db_root"]]
    path = spec["path"] if os.path.isabs(spec["path"]) else os.path.join(DATA, spec["path"])
    if s.db_ids is not None:  # the split's databases, then the first N of their questions
        rows, _ = READERS[s.reader](path, roots, data_source=s.name, require_db=False)
        keep = {"db_ids": s.db_ids, "max_hardness": s.max_hardness or None,
                "query_fold": list(s.query_fold) if s.query_fold else None}
        rows, missing = drop_missing_db(select_rows(rows, keep, path)[:limit or None], path)
        if not rows and missing:
            raise FileNotFoundError(f"{s.name}: none of the {missing} questions has its database under {roots} "
                                    "(DIR/<db_id>/<db_id>.sqlite)")
        return rows, {"questions": len(rows), "skipped_no_db": missing}
    if s.query_fold is not None:
        raise ValueError(f"{s.name}: query_fold is applied with db_ids only (the split's databases)")
    # the first N *questions* (the paper's first 1,000), then those without a database are skipped
    if s.max_hardness:  # the first N questions of that hardness
        rows, missing = READERS[s.reader](path, roots, data_source=s.name)
        rows = select_rows(rows, {"max_hardness": s.max_hardness}, path)[:limit or None]
    else:
        rows, missing = READERS[s.reader](path, roots, data_source=s.name, limit=limit)
    if not rows and missing:
        raise FileNotFoundError(f"{s.name}: none of the {missing} questions has its database under {roots} "
                                "(DIR/<db_id>/<db_id>.sqlite)")
    return rows, {"questions": len(rows), "skipped_no_db": missing}
