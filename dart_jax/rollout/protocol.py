"""Task protocols: the tags, stop sequences and observation rendering of Search-R1 QA and
SkyRL-SQL (their rollout protocols)."""

from __future__ import annotations

import dataclasses

from dart_jax.tokenization.tokenizer import stop_ids

# How the tags written in a prompt's instructions are encoded. "atomic" (the authors' code): the
# template's own "<search> query </search>" is the sentinel ids, as the model will write them;
# "text": the whole prompt is ordinary text, so a prompt never moves the router. Dataset text
# (questions, schemas, evidence) is ordinary text either way (rollout.tasks.encode_prompt).
PROMPT_TAGS = ("atomic", "text")

SEARCH_R1_INVALID = ("\nMy previous action is invalid. If I want to search, I should put the query between "
                     "<search> and </search>. If I want to give the final answer, I should put the answer "
                     "between <answer> and </answer>. Let me try again.\n")
SQL_INVALID = ("\nMy previous action is invalid. If I want to query the database, I should put one SQL "
               "statement between <sql> and </sql>. If I want to give the final answer, I should put the "
               "SQL between <solution> and </solution>. Let me try again.\n")


@dataclasses.dataclass(frozen=True)
class Protocol:
    name: str
    tool_open: str
    tool_close: str
    answer_open: str
    answer_close: str
    obs_open: str
    obs_close: str
    invalid_message: str

    def render_observation(self, body: str, turns_left: int | None = None) -> str:
        if self.name == "sql":
            left = "" if turns_left is None else (f"\n<reminder>You have {turns_left} turns left to complete the "
                                                  "task.</reminder>")
            return f"\n\n{self.obs_open}{body}{left}{self.obs_close}\n\n"
        return f"\n\n{self.obs_open}{body}{self.obs_close}\n\n"

    def reward_observation(self, tool: bool = True) -> str:
        """What a reward reads in place of an observation the model received (`TrajectoryBatch.reward_text`):
        a tool result is its wrapper tags around an empty body, so Search-R1's and SkyRL's format checks see
        the structure the tool inserted and nothing a passage, cell or column name says; a corrective
        message (`tool=False`: the invalid-action text, which itself spells <answer> / <solution>) is a
        line break."""
        return self.render_observation("") if tool else "\n"


QA = Protocol("qa", "<search>", "</search>", "<answer>", "</answer>", "<information>", "</information>",
              SEARCH_R1_INVALID)
SQL = Protocol("sql", "<sql>", "</sql>", "<solution>", "</solution>", "<observation>", "</observation>",
               SQL_INVALID)
PROTOCOLS = {"qa": QA, "sql": SQL}


CONTEXTS = ("", " ", "\n", "x", "x ", "x\n", "x. ", "x\n\n")


def tag_variants(tokenizer, tag: str) -> list[tuple[int, ...]]:
    """Token-id sequences the tag can take in running text, so a multi-token tag such as </answer>
    stops generation however it was tokenised: for each context (start of text, after a space, a
    newline, a word, ...), the shortest token suffix of `context + tag` whose text contains the tag.
    BPE merges the preceding space into the tag's first token (SmolLM2: 'x </answer>' is
    ['x', ' </', 'answer', '>']), so the variants differ in their first token."""
    out = []
    for ctx in CONTEXTS:
        ids = tokenizer.encode(ctx + tag, add_special_tokens=False)
        for k in range(1, len(ids) + 1):
            if tag in tokenizer.decode(ids[-k:]):
                seq = tuple(ids[-k:])
                if seq not in out:
                    out.append(seq)
                break
    return out


def stop_sequences(tokenizer, protocol: Protocol,
                   eos: tuple[int, ...] = ()) -> tuple[tuple[tuple[int, ...], ...], dict]:
    """-> (stop sequences, {"tool": [indices], "answer": [...], "eos": [...]})."""
    groups: dict[str, list[int]] = {"tool": [], "answer": [], "eos": []}
    stops: list[tuple[int, ...]] = []
    for group, seqs in (("tool", tag_variants(tokenizer, protocol.tool_close)),
                        ("answer", tag_variants(tokenizer, protocol.answer_close)),
                        ("eos", [(i,) for i in stop_ids(tokenizer, eos)])):
        for s in seqs:
            if s not in stops:
                groups[group].append(len(stops))
                stops.append(s)
    return tuple(stops), groups
