"""The lab's evaluation sets: each loads only its (hops, op) cells and names its world's corpus, and an
evaluation searches a lab set over that corpus (a scripted tiny model's query finds world-1 passages there
and world-0 passages in a set searched by the run's retriever over world 0), records per-cell role skills
and the degeneracy gate's verdict, and resumes a set only over the corpus it was searched over."""

import json
import logging
import os
import shutil

import pytest
import torch
from safetensors.torch import load_file, save_file

from configs import evaluate as eval_config
from dart_jax.data.paths import DATA
from dart_jax.errors import UserError
from dart_jax.eval import resume
from dart_jax.eval.datasets import EVAL_SETS, LAB_SETS, load_set, resolve
from dart_jax.eval.job import evaluate, gate_verdicts
from dart_jax.eval.runner import EvalOptions
from dart_jax.lab.metrics import titles
from dart_jax.tokenization.sentinels import add_sentinel_tokens
from dart_jax.tokenization.tokenizer import load_tokenizer

OPS = {"none", "bool", "compare", "count", "diff", "sum"}
QUERY = "Draica Collective"  # an organisation of world 1 (data/lab/world1/world.json)


def _world_titles(world: int) -> set[str]:
    with open(os.path.join(DATA, f"lab/world{world}/corpus.jsonl")) as f:
        return {titles(f"Doc 1(Title: {json.loads(line)['contents'].split(chr(10))[0]})")[0] for line in f}


def test_lab_sets_load_only_their_cells_and_name_their_corpus():
    w1, easy, w0 = resolve(["lab_world1", "lab_world1_easy", "lab_world0"], "qa")
    assert {s.name for s in LAB_SETS} == {"lab_world1", "lab_world1_easy", "lab_world0"}
    assert w1.spec()["lab_hops"] == [2, 3] and "lab_ops" not in w1.spec()  # every op
    for s, hops, world in ((w1, {2, 3}, 1), (easy, {1}, 1), (w0, {2, 3}, 0)):
        assert s.corpus == f"lab/world{world}/corpus.jsonl" and os.path.isfile(s.corpus_path())
        rows, counts = load_set(s)
        cells = {(r["lab"]["hops"], r["lab"]["op"]) for r in rows}
        assert cells == {(h, op) for h in hops for op in OPS}, s.name
        assert counts["questions"] == len(rows) == 100 * len(cells)  # 100 a cell in the shipped worlds
        assert all(f"lab{world}-q" in r["id"] for r in rows)  # (ids: "lab-lab1-q…")
        # the file is written cell by cell: the first N questions are taken in turns over the cells
        first, _ = load_set(s, limit=len(cells))
        assert {(r["lab"]["hops"], r["lab"]["op"]) for r in first} == cells
    assert w0.in_distribution and not w1.in_distribution and not easy.in_distribution
    assert not EVAL_SETS["nq"].corpus


def test_a_set_narrowed_to_chosen_ids_loads_them_in_their_order():
    """A CEA screen's selection (EvalSet.ids): exactly those questions, in the selection's order, before
    `limit`; an id the set lacks and a narrowed SQL set are refused; resolve passes such a set through."""
    import dataclasses

    from dart_jax.eval.datasets import ids_digest
    rows, _ = load_set(EVAL_SETS["lab_world1"], limit=10)
    ids = [rows[7]["id"], rows[2]["id"], rows[5]["id"]]
    narrowed = dataclasses.replace(EVAL_SETS["lab_world1"], ids=tuple(ids))
    assert [r["id"] for r in load_set(narrowed)[0]] == ids
    assert [r["id"] for r in load_set(narrowed, limit=2)[0]] == ids[:2]
    assert resolve([narrowed, "nq"], "qa") == [narrowed, EVAL_SETS["nq"]]
    with pytest.raises(ValueError, match="1 selected question ids are not among"):
        load_set(dataclasses.replace(narrowed, ids=(ids[0], "lab1-q999999")))
    with pytest.raises(ValueError, match="QA sets only"):
        load_set(dataclasses.replace(EVAL_SETS["spider_dev"], ids=("0",)))
    assert ids_digest(ids) != ids_digest(ids[::-1]) and ids_digest(ids).startswith("3:")


def _scripted(model_dir: str, out: str) -> str:
    """The tiny random model made a bigram machine that writes `<search> Draica Collective </search>` after
    the prompt: attention and MLP outputs zeroed (the residual stream is the current token's embedding),
    one embedding axis per scripted token, the head mapping each to the next. Saved with the sentinel tags
    (<search> and </search> are one id each, as the evaluated policy's tokenizer has them)."""
    shutil.copytree(model_dir, out)
    tok = load_tokenizer(model_dir)
    add_sentinel_tokens(tok)
    tok.save_pretrained(out)
    script = [198] + tok.encode(f"<search> {QUERY} </search>", add_special_tokens=False)  # 198: "\n"
    assert len(set(script)) == len(script)  # a bigram machine: one successor per token
    path = os.path.join(out, "model.safetensors")
    w = load_file(path)
    for k in w:
        if k.endswith(("o_proj.weight", "down_proj.weight")):
            w[k] = torch.zeros_like(w[k])
    w["model.norm.weight"] = torch.ones_like(w["model.norm.weight"])
    hidden = w["model.embed_tokens.weight"].shape[1]
    emb, head = torch.zeros(len(tok), hidden), torch.zeros(len(tok), hidden)
    for i, t in enumerate(script):
        emb[t, i] = 1.0
    for i, b in enumerate(script[1:]):
        head[b, i] = 10.0
    w["model.embed_tokens.weight"], w["lm_head.weight"] = emb, head
    save_file(w, path, metadata={"format": "pt"})
    with open(os.path.join(out, "config.json")) as f:
        cfg = json.load(f)
    with open(os.path.join(out, "config.json"), "w") as f:
        json.dump(dict(cfg, vocab_size=len(tok)), f)
    return out


def _config(model_dir: str):
    c = eval_config.get_config("qa")
    c.model.path = model_dir
    # the run's retriever: lexical over world 0 (what a set without its own corpus is searched over)
    c.retriever.kind, c.retriever.corpus, c.retriever.topk = "lexical", os.path.join(DATA, "lab/world0/corpus.jsonl"), 2
    c.rollout.max_turns, c.rollout.max_tokens_per_turn = 1, 16
    c.rollout.max_obs_tokens, c.rollout.max_response_tokens = 96, 160
    c.mesh.shape = (1, 1, 1)
    return c


def _records(out) -> list[dict]:
    return resume.read_records(os.path.join(out, "per_question.jsonl"))


def test_a_lab_set_is_searched_over_its_world_with_role_skills_per_cell(tiny_smollm_dir, tmp_path, caplog):
    c = _config(_scripted(tiny_smollm_dir, str(tmp_path / "model")))
    out = str(tmp_path / "eval")
    opts = EvalOptions(limit=2, batch=2, progress=False)
    with caplog.at_level(logging.WARNING, logger="dart_jax.eval.job"):
        res = evaluate(c, out, ["lab_world1", "hotpotqa"], opts)
    recs = _records(out)
    w1, w0 = _world_titles(1), _world_titles(0)
    assert QUERY.lower() in w1 and QUERY.lower() not in w0
    lab = [r for r in recs if r["dataset"] == "lab_world1"]
    other = [r for r in recs if r["dataset"] == "hotpotqa"]
    assert len(lab) == len(other) == 2
    for r in recs:  # the scripted query, once per trajectory
        assert [q["query"] for q in r["tool_calls"]] == [QUERY], r["response"][:200]
    # world 1's corpus for the lab set (its records say so), the run's index over world 0 for the other
    for r in lab:
        got = titles(r["tool_calls"][0]["observation"])
        assert r["corpus"] == "lab/world1/corpus.jsonl" and got and set(got) <= w1 and got[0] == QUERY.lower()
    for r in other:
        got = titles(r["tool_calls"][0]["observation"])
        assert "corpus" not in r and got and set(got) <= w0
    assert res["setup"]["corpora"]["lab_world1"]["corpus"] == "lab/world1/corpus.jsonl"
    assert res["setup"]["corpora"]["lab_world1"]["kind"] == "lexical" and "hotpotqa" not in res["setup"]["corpora"]
    d = res["datasets"]["lab_world1"]
    assert d["corpus"] == "lab/world1/corpus.jsonl" and "lab" not in res["datasets"]["hotpotqa"]
    # role skills pooled and per cell: the first two questions are one of each of the first two cells
    pooled, cells = d["lab"]["pooled"], d["lab"]["cells"]
    assert list(cells) == ["h2_bool", "h2_compare"]
    assert pooled["lab/trajectories"] == 2 and pooled["lab/tool_calls"] == 1.0 and pooled["lab/copy_rate"] == 0.0
    for m in cells.values():
        assert m["lab/trajectories"] == 1
        for k in ("lab/tool_skill", "lab/chain_coverage", "lab/accuracy", "lab/copy_rate"):
            assert 0.0 <= m[k] <= 1.0, (k, m[k])
        assert m["lab/distinct_think"] == 0  # the script writes no <think>
    # the gate flags a setting with no reasoning to measure, loudly, and the reports carry the verdict
    assert d["lab"]["gate"] and "no <think> span" in d["lab"]["gate"][0]
    assert any("degeneracy gate: lab_world1" in m for m in caplog.messages)
    md = open(os.path.join(out, "results.md")).read()
    assert "## Lab role skills" in md and "degeneracy gate: FLAGGED" in md and "| h2_compare |" in md
    assert "lab_world1: retrieval over its own corpus lab/world1/corpus.jsonl (lexical" in md
    saved = json.load(open(os.path.join(out, "results.json")))
    assert saved["datasets"]["lab_world1"]["lab"]["cells"]["h2_bool"]["lab/trajectories"] == 1
    # where the set's rollouts spent their time (Agent.take_phases): its tool call, parts of its seconds
    ph = saved["datasets"]["lab_world1"]["phases"]
    assert ph["segments"] >= 2 and ph["appends"] >= 1 and 0 < ph["decode_fill"] <= 1
    assert 0 < ph["decode_s"] + ph["tool_s"] + ph["append_s"] <= saved["datasets"]["lab_world1"]["seconds"] + 0.1
    assert "lab/tool_skill" in open(os.path.join(out, "results.csv")).readline()

    # resuming reuses a set only over the corpus it was searched over
    progress = json.load(open(os.path.join(out, resume.PROGRESS)))
    assert progress["searched"]["lab_world1"]["corpus"] == "lab/world1/corpus.jsonl"
    moved = dict(res["setup"], corpora={"lab_world1": dict(res["setup"]["corpora"]["lab_world1"],
                                                           corpus="lab/world0/corpus.jsonl")})
    assert set(resume.prior(out, moved, 2)) == {"hotpotqa"}
    assert set(resume.prior(out, res["setup"], 2)) == {"lab_world1", "hotpotqa"}
    # --strict-gate (evaluate(strict_gate=True), once the reports are written): an error naming the set
    with pytest.raises(UserError, match=r"degeneracy gate \(--strict-gate\): lab_world1: no <think>"):
        gate_verdicts(saved, strict=True)


def test_cli_strict_gate_is_an_error_exit_after_the_reports(tiny_smollm_dir, tmp_path):
    from launch import evaluate as cli
    model = _scripted(tiny_smollm_dir, str(tmp_path / "model"))
    out = tmp_path / "eval"
    args = [f"--config.model.path={model}", "--config.retriever.kind=lexical", "--config.rollout.max_turns=1",
            "--config.rollout.max_tokens_per_turn=16", "--config.rollout.max_obs_tokens=96",
            "--config.rollout.max_response_tokens=160", "--dataset=lab_world1_easy", "--limit=1", "--batch=1",
            f"--out={out}", "--quiet"]
    with pytest.raises(UserError, match=r"--strict-gate\): lab_world1_easy: no <think> span .*results written to"):
        cli.main(args + ["--strict-gate"])
    res = json.load(open(out / "results.json"))  # written before the error
    assert res["datasets"]["lab_world1_easy"]["lab"]["cells"]["h1_bool"]["lab/tool_calls"] == 1.0
    assert res["setup"]["corpora"]["lab_world1_easy"]["kind"] == "lexical"
    assert cli.main(args) == 0  # not strict: the verdict is a warning (and every batch is reused)
    assert json.load(open(out / "results.json"))["setup"]["resumed"] == {"lab_world1_easy": 1}
