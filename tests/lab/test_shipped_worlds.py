"""The shipped lab worlds (data/lab/world0, world1) are what `launch.lab_build` writes, byte for byte; dataset
entries select their cells; lab questions get the lab's short prompt and every other QA row Search-R1's."""

import filecmp
import json

import pytest

from configs import lab_quickstart, sft_lab_quickstart
from dart_jax.data.paths import repo_path
from dart_jax.data.prompts import LAB_TEMPLATE, SEARCH_R1_TEMPLATE, qa_row_prompt
from dart_jax.data.readers import DataError, load_rows
from dart_jax.rollout.tasks import qa_task
from dart_jax.tokenization.sentinels import add_sentinel_tokens
from dart_jax.tokenization.tokenizer import load_tokenizer
from launch import lab_build


@pytest.mark.parametrize("seed", [0, 1])
def test_shipped_world_is_the_generators_output(seed, tmp_path):
    out = tmp_path / f"world{seed}"
    assert lab_build.main([f"--seed={seed}", f"--out={out}", "--per-cell=100"]) == 0
    shipped = repo_path(f"data/lab/world{seed}")
    for name in ("world.json", "corpus.jsonl", "questions.jsonl", "stats.json"):
        assert filecmp.cmp(out / name, f"{shipped}/{name}", shallow=False), name


def test_dataset_entries_select_lab_cells(tmp_path):
    rows = load_rows(sft_lab_quickstart.lab_questions(sft_lab_quickstart.WORLD0, (2, 3), ("sum", "bool")))
    assert len(rows) == 2 * 2 * 100  # 100 per cell in the shipped file
    assert {(r["lab"]["hops"], r["lab"]["op"]) for r in rows} == {(h, o) for h in (2, 3) for o in ("sum", "bool")}
    # the quickstart's training and held-out sets: RL difficulty, two different worlds, no question shared
    train = load_rows(dict(lab_quickstart.get_config().data.train[0]))
    held = load_rows(dict(lab_quickstart.get_config().eval.data[0]))
    assert {r["lab"]["hops"] for r in train} == {r["lab"]["hops"] for r in held} == {2, 3}
    assert not {r["question"] for r in train} & {r["question"] for r in held}
    assert all("-lab0-q" in r["id"] for r in train) and all("-lab1-q" in r["id"] for r in held)
    # a cell filter on a file without lab rows names the problem
    plain = tmp_path / "plain.jsonl"
    plain.write_text(json.dumps({"id": "q1", "question": "who?", "golden_answers": ["x"]}) + "\n")
    with pytest.raises(DataError, match="lab_hops selects lab questions"):
        load_rows(dict(reader="flashrag", path=str(plain), lab_hops=[1]))


def test_lab_rows_get_the_short_prompt():
    tok = load_tokenizer("smollm2-135m-instruct")
    add_sentinel_tokens(tok)
    lab = load_rows(sft_lab_quickstart.lab_questions(sft_lab_quickstart.WORLD1, (2,), ("diff",)))[:1]
    plain = [{k: v for k, v in lab[0].items() if k != "lab"}]
    assert qa_row_prompt(lab[0]) == LAB_TEMPLATE.format(question=lab[0]["question"])
    assert qa_row_prompt(plain[0]) == SEARCH_R1_TEMPLATE.format(question=plain[0]["question"])
    (p_lab,), _, _ = qa_task(tok, lab)
    (p_plain,), _, _ = qa_task(tok, plain)
    # same question, same chat template: the lab's prompt is under 70% of the Search-R1 one
    assert len(p_lab) < 120 and len(p_lab) < 0.7 * len(p_plain), (len(p_lab), len(p_plain))


def test_a_missing_held_out_corpus_is_named_before_the_run():
    from dart_jax.run.checks import check_datasets
    from dart_jax.run.spec import run_spec
    c = lab_quickstart.get_config()
    assert check_datasets(run_spec(c, 1)).status == "ok"
    c.eval.corpus = "data/lab/world9/corpus.jsonl"
    got = check_datasets(run_spec(c, 1))
    assert got.status == "FAIL" and "eval.corpus=data/lab/world9/corpus.jsonl not found" in got.message, got
