"""Ready-made rollout tasks on the embedded data: QA over the shipped corpus, NL2SQL on Spider dev.
Each returns prompts (chat-templated ids), uids and per-row metadata (what the task's reward reads:
`rewards.training`)."""

from __future__ import annotations

import logging
import os

from dart_jax.data.corpus import read_jsonl
from dart_jax.data.paths import DATA
from dart_jax.data.prompts import qa_row_prompt, sql_prompt
from dart_jax.rollout.protocol import PROMPT_TAGS
from dart_jax.tokenization.tokenizer import Untrusted, encode_chat

log = logging.getLogger(__name__)


def encode_prompt(tokenizer, build, prompt_tags: str = "atomic") -> list[int]:
    """The chat-encoded user prompt `build(mark)`, with the values it marks as untrusted text."""
    if prompt_tags not in PROMPT_TAGS:
        raise ValueError(f"prompt_tags={prompt_tags!r}; expected one of {PROMPT_TAGS}")
    untrusted = Untrusted()
    content = build(untrusted) if prompt_tags == "atomic" else untrusted(build(lambda v: v))
    return encode_chat(tokenizer, [{"role": "user", "content": content}], untrusted=untrusted)


def response_room(rc) -> int:
    """The fewest response tokens a prompt must leave in the model's context: one full turn
    (`min(max_response_tokens, max_tokens_per_turn)` of a rollout.agent.RolloutConfig)."""
    return min(int(rc.max_response_tokens), int(rc.max_tokens_per_turn))


def overlong(prompts: list[list[int]], context: int, rc) -> list[bool]:
    """The context rule, checked before any forward: a prompt is refused when
    len(prompt) + response_room(rc) > context (the model's max_position_embeddings), i.e. when it
    leaves less than one full turn of the context for the response. A prompt that fits decodes at most
    context − len(prompt) response tokens (the agent loop caps each row there: finish "length").
    Training drops a refused prompt's group from the step's loss (rl.stages.rollout, counted as
    `rollout/prompts_overlong`); evaluation skips the question and counts it (`skipped_overlong`)."""
    need = response_room(rc)
    return [len(p) + need > int(context) for p in prompts]


def qa_rows(path: str | None = None, n: int = 4, offset: int = 0) -> list[dict]:
    path = path or os.path.join(DATA, "qa", "nq_oracle.jsonl")
    rows = list(read_jsonl(path))[offset:offset + n]
    for r in rows:
        if "question" not in r or "golden_answers" not in r:
            raise ValueError(f"{path}: row {r.get('id')} lacks 'question' or 'golden_answers'")
    return rows


def spider_rows(n: int = 4, offset: int = 0, spider_dir: str | None = None) -> list[dict]:
    """Spider dev gold queries whose database is present (wta_1 is not shipped)."""
    spider_dir = spider_dir or os.path.join(DATA, "spider")
    out = []
    with open(os.path.join(spider_dir, "dev_gold.sql")) as f:
        for k, line in enumerate(f):
            sql, db = line.rstrip("\n").rsplit("\t", 1)
            path = os.path.join(spider_dir, "database", db, f"{db}.sqlite")
            if os.path.isfile(path):
                out.append({"id": f"spider-dev-{k}", "db_id": db, "db_path": path, "query": sql})
    questions = os.path.join(spider_dir, "dev_questions.jsonl")
    if not os.path.isfile(questions):
        raise FileNotFoundError(f"{questions} not found: Spider questions (id, db_id, question, query) per line")
    qs = {r["id"]: r["question"] for r in read_jsonl(questions)}
    for r in out:
        if r["id"] not in qs:
            raise ValueError(f"{questions}: no question for {r['id']} ({r['db_id']})")
        r["question"] = qs[r["id"]]
    return out[offset:offset + n]


def qa_task(tokenizer, rows: list[dict], prompt_tags: str = "atomic") -> tuple[list[list[int]], list, list[dict]]:
    prompts = [encode_prompt(tokenizer, lambda mark, r=r: qa_row_prompt(r, mark), prompt_tags) for r in rows]
    metas = [{"golden_answers": r["golden_answers"]} for r in rows]
    return prompts, [r["id"] for r in rows], metas


def sql_task(tokenizer, rows: list[dict], prompt_tags: str = "atomic") -> tuple[list[list[int]], list, list[dict]]:
    prompts = [encode_prompt(tokenizer, lambda mark, r=r: sql_prompt(r["question"], r["db_path"],
                                                                     r.get("evidence", ""), mark), prompt_tags)
               for r in rows]
    metas = [{"db_path": r["db_path"], "gold_sql": r["query"]} for r in rows]
    return prompts, [r["id"] for r in rows], metas


def fitting_rows(tokenizer, task: str, rows: list[dict], context: int, rc, what: str = "") -> tuple[list[dict], int]:
    """-> (the rows whose prompts the context rule (`overlong`) accepts, how many it refused). Rows
    without the task's reference (held-out evaluation skips them itself) are kept, not encoded. `what`
    (e.g. "held-out questions"): a refusal is logged as one warning naming them."""
    need = ("db_path", "query") if task == "sql" else ("golden_answers",)
    idx = [i for i, r in enumerate(rows) if all(r.get(k) for k in need)]
    prompts = (sql_task if task == "sql" else qa_task)(tokenizer, [rows[i] for i in idx], rc.prompt_tags)[0]
    refused = {i for i, o in zip(idx, overlong(prompts, context, rc)) if o}
    if refused and what:
        log.warning("%d %s left out: their prompts leave less than %d response tokens of the model's context "
                    "(%d positions)", len(refused), what, response_room(rc), context)
    return [r for i, r in enumerate(rows) if i not in refused], len(refused)
