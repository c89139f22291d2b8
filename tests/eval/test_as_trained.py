"""`launch.evaluate --checkpoint=RUN` without --config / --model evaluates RUN as it was trained.

A tiny Qwen2 (SmolLM2's real tokenizer with the sentinel tags) is trained for one GRPO step against
a real retrieval server on 127.0.0.1 serving a three-passage index; the evaluation must then load
that Qwen2 (not the embedded SmolLM2 of configs/evaluate.py), search that server (its request counter
moves; every passage read is one of the three, none of the shipped corpus) with the run's rollout
settings, and say so in its header. A base the adapters were not trained on, or a run's retriever
that no longer answers, is refused in one line before anything loads; an override of a run's
setting is printed.

The tiny Qwen2's attention and MLP outputs are zero (o_proj, down_proj = 0), so each position's
logits are a function of its own token: its weights are set so that greedy decoding writes
`<search> France</search>` after the prompt, i.e. it searches on every question — what a random
model would almost never do.
"""

import json
import os
import shutil
import socket

import numpy as np
import pytest
import torch
import transformers

from configs import quickstart
from dart_jax.checkpoints.base_identity import describe_base
from dart_jax.errors import UserError
from dart_jax.eval.as_trained import check_base
from trained_run import PASSAGES, QUERY_WORD, passage_server, searching_qwen2, train_tiny_run


@pytest.fixture(scope="module")
def qwen_dir(tmp_path_factory, tiny_smollm_dir):
    return searching_qwen2(str(tmp_path_factory.mktemp("tiny_qwen2")), tiny_smollm_dir)


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    s = passage_server(tmp_path_factory.mktemp("tiny_index"))
    yield s
    s.stop()


@pytest.fixture(scope="module")
def run(qwen_dir, server, tmp_path_factory):
    """One GRPO step of DART on the tiny Qwen2 against the server; -> the run directory."""
    return train_tiny_run(qwen_dir, server.url, tmp_path_factory.mktemp("run"))


def _evaluate(argv):
    from launch import evaluate
    return evaluate.main(argv)


def test_a_run_is_evaluated_with_its_base_and_its_retriever(run, qwen_dir, server, tmp_path, capsys):
    before = dict(server.stats)
    out = tmp_path / "eval"
    assert _evaluate([f"--checkpoint={run}", "--limit=2", "--dataset=nq", "--batch=2", f"--out={out}",
                      "--quiet"]) == 0
    res = json.load(open(out / "results.json"))
    setup = res["setup"]
    # the run's base, not configs/evaluate.py's embedded SmolLM2
    assert setup["model"] == qwen_dir and setup["architecture"].startswith("qwen2, 2 layers, hidden 32")
    assert setup["adapters"] == os.path.join(run, "adapters") and setup["variant"] == "dart"
    # the run's retriever and rollout settings
    assert setup["retriever"]["url"] == server.url and setup["retriever"]["topk"] == 2
    assert setup["rollout"]["max_turns"] == 1 and setup["rollout"]["max_obs_tokens"] == 96
    recs = [json.loads(line) for line in open(out / "per_question.jsonl")]
    calls = [c for r in recs for c in r["tool_calls"]]
    assert len(recs) == 2 and len(calls) >= 2 and all(c["query"].strip() == QUERY_WORD.strip() for c in calls)
    assert server.stats["requests"] > before["requests"]
    assert server.stats["queries"] - before["queries"] >= len(calls)  # (and the retriever check's probe)
    ours = {p["contents"].split("\n")[1] for p in PASSAGES}
    for c in calls:  # every passage read is one of the served index's: the shipped corpus was not searched
        read = [line.split(") ", 1)[1] for line in c["observation"].splitlines() if line.startswith("Doc ")]
        assert len(read) == 2 and set(read) <= ours
    # the header names them
    md = open(out / "results.md").read()
    printed = capsys.readouterr().out
    for text in (md, printed):
        assert f"- model: {qwen_dir} (qwen2, 2 layers, hidden 32" in text
        assert f"- retrieval: the retrieval server at {server.url}, top-2 passages" in text
        assert "- protocol: Search-R1 (qa), up to 1 tool turns of ≤ 8 tokens" in text
        assert "- sampling: greedy (temperature 0), 1 sample per question" in text
        assert f"- settings: as {run} was trained (run_config.json, dart_adapters.json)\n" in text
    assert "run's" not in printed  # nothing overridden, nothing listed


def test_the_run_directory_its_adapters_and_its_checkpoints_give_the_same_settings(run, qwen_dir, server, capsys):
    from launch import evaluate
    for given in (run, os.path.join(run, "adapters"), os.path.join(run, "checkpoints")):
        evaluate.CLI.parse([f"--config={evaluate.EVAL_CONFIG}", f"--checkpoint={given}"])
        config, trained = evaluate.build_config([f"--checkpoint={given}"])
        assert (config.model.path, config.retriever.url, config.rollout.max_turns) == (qwen_dir, server.url, 1)
        assert trained == {"run": run, "records": ["run_config.json", "dart_adapters.json"], "overrides": []}
    # an override is applied and printed, one line each, naming the flag
    argv = [f"--checkpoint={run}", "--config.rollout.max_turns=3", "--task=qa"]
    evaluate.CLI.parse([f"--config={evaluate.EVAL_CONFIG}"] + argv)
    config, trained = evaluate.build_config(argv)
    assert config.rollout.max_turns == 3 and config.retriever.url == server.url
    assert capsys.readouterr().out == "rollout.max_turns: run's 1 → 3 (from --config.rollout.max_turns)\n"
    # an explicit --config: every as-trained value it changes is listed, the file named
    argv = [f"--config={evaluate.EVAL_CONFIG}", f"--checkpoint={run}"]
    evaluate.CLI.parse(argv)
    config, trained = evaluate.build_config(argv)
    lines = capsys.readouterr().out.splitlines()
    assert f"model.path: run's {qwen_dir} → smollm2-135m-instruct (from --config={evaluate.EVAL_CONFIG})" in lines
    assert f"retriever.url: run's {server.url} → \"\" (from --config={evaluate.EVAL_CONFIG})" in lines
    assert trained["overrides"] == lines


def test_a_base_the_adapters_were_not_trained_on_is_refused_in_one_line(run, qwen_dir, tiny_smollm_dir, server,
                                                                       tmp_path, capsys):
    from launch import evaluate
    with pytest.raises(SystemExit) as e:
        evaluate.CLI.run(evaluate.main, [f"--checkpoint={run}", f"--model={tiny_smollm_dir}", "--limit=2",
                                         "--dataset=nq", f"--out={tmp_path / 'no'}", "--quiet"])
    assert e.value.code == 2
    captured = capsys.readouterr()
    assert captured.out == f"model.path: run's {qwen_dir} → {tiny_smollm_dir} (from --model)\n"
    err = captured.err.strip()
    assert "\n" not in err and err.startswith(f"launch.evaluate: model.path={tiny_smollm_dir} is not the base model")
    assert "model_type qwen2 ≠ llama" in err and not os.path.exists(tmp_path / "no")
    # a run's retriever that no longer answers: one line before the model loads, not minutes of retries
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        dead = f"http://127.0.0.1:{sock.getsockname()[1]}/retrieve"
    with pytest.raises(SystemExit) as e:
        evaluate.CLI.run(evaluate.main, [f"--checkpoint={run}", f"--config.retriever.url={dead}", "--limit=2",
                                         "--dataset=nq", f"--out={tmp_path / 'dead'}", "--quiet"])
    assert e.value.code == 2
    captured = capsys.readouterr()
    assert f"retriever.url: run's {server.url} → {dead} (from --config.retriever.url)" in captured.out
    err = captured.err.strip()
    assert "\n" not in err and err.startswith(f"launch.evaluate: retriever.url={dead} does not accept connections")
    assert not os.path.exists(tmp_path / "dead")
    # the same architecture with other weights is refused too; the same files elsewhere are not
    other = tmp_path / "other_qwen2"
    shutil.copytree(qwen_dir, other)
    weights = transformers.AutoModelForCausalLM.from_pretrained(str(other))
    with torch.no_grad():  # every row of the (largest) tables moves, as in any fine-tune
        weights.model.embed_tokens.weight.add_(0.01)
        weights.lm_head.weight.add_(0.01)
    weights.save_pretrained(str(other), safe_serialization=True)
    with pytest.raises(UserError, match="same architecture, other weights"):
        check_base(run, str(other))
    same = tmp_path / "same_qwen2"
    shutil.copytree(qwen_dir, same)
    check_base(run, str(same))
    # the manifest records the base's identity; one written before it did is checked against its named base
    manifest = json.load(open(os.path.join(run, "adapters", "dart_adapters.json")))
    assert manifest["base_config"] == describe_base(qwen_dir)
    assert manifest["base_config"]["hidden_size"] == 32 and manifest["base_config"]["vocab_size"] == len(
        transformers.AutoTokenizer.from_pretrained(qwen_dir))
    old = tmp_path / "old_adapters"
    shutil.copytree(os.path.join(run, "adapters"), old)
    del manifest["base_config"]
    json.dump(manifest, open(old / "dart_adapters.json", "w"))
    with pytest.raises(UserError, match="model_type qwen2 ≠ llama"):
        check_base(str(old), tiny_smollm_dir)
    check_base(str(old), qwen_dir)


def test_weights_fingerprint_reads_slices_not_the_whole_file(tmp_path):
    """Two files that differ in one byte in the middle of a slice differ; the fingerprint is a pure
    function of the bytes (an independent re-hash of the same slices agrees)."""
    import hashlib

    from dart_jax.checkpoints.base_identity import SLICE_BYTES, SLICES, weights_fingerprint
    data = np.random.default_rng(0).integers(0, 256, 1 << 20, dtype=np.uint8).tobytes()
    a = tmp_path / "a.safetensors"
    a.write_bytes(data)
    h = hashlib.sha256(f"a.safetensors:{len(data)};".encode())
    starts = [k * (len(data) - SLICE_BYTES) // (SLICES - 1) for k in range(SLICES)]
    for start in starts:
        h.update(data[start:start + SLICE_BYTES])
    assert weights_fingerprint([str(a)]) == h.hexdigest()
    b = tmp_path / "b" / "a.safetensors"
    b.parent.mkdir()
    flip = starts[5] + 7
    b.write_bytes(data[:flip] + bytes([data[flip] ^ 1]) + data[flip + 1:])
    assert weights_fingerprint([str(b)]) != weights_fingerprint([str(a)])


def test_an_adapter_directory_without_its_run_brings_its_base():
    """The shipped warm start holds a manifest and no run_config.json: its base model applies."""
    from configs import evaluate as eval_config
    from dart_jax.eval.as_trained import adopt, locate
    found = locate(quickstart.WARM_START)
    assert found.records == ["dart_adapters.json"] and found.base == "smollm2-135m-instruct"
    c = eval_config.get_config("qa")
    c.model.path = "elsewhere"
    adopt(c, found)
    assert c.model.path == "smollm2-135m-instruct" and c.warm_start == ""


def test_the_header_names_model_retrieval_protocol_samples_and_temperature():
    from dart_jax.eval.report import header
    setup = {"task": "qa", "policy": "p", "model": "Qwen/Qwen2.5-3B", "architecture": "qwen2, 36 layers",
             "model_config": {"param_dtype": "bfloat16", "compute_dtype": "bfloat16"}, "n_samples": 8,
             "temperature": 1.0, "top_p": 1.0, "top_k": 0, "limit": 1000,
             "retriever": {"url": "", "index_dir": "indexes/wiki18", "encoder": "intfloat/e5-base-v2",
                           "query_prefix": "query: ", "passage_prefix": "passage: ", "topk": 3},
             "rollout": {"max_turns": 4, "max_tokens_per_turn": 500, "max_obs_tokens": 1024,
                         "max_response_tokens": 4096},
             "as_trained": {"run": "runs/x/adapters", "records": ["dart_adapters.json"], "overrides": []}}
    assert header({"setup": setup, "datasets": {}}) == [
        "- model: Qwen/Qwen2.5-3B (qwen2, 36 layers; weights bfloat16, compute bfloat16)",
        "- retrieval: the index indexes/wiki18 with the encoder intfloat/e5-base-v2, query prefix \"query: \", "
        "passage prefix \"passage: \", top-3 passages",
        "- protocol: Search-R1 (qa), up to 4 tool turns of ≤ 500 tokens, observations ≤ 1024 tokens, responses "
        "≤ 4096 tokens",
        "- sampling: 8 samples per question at temperature 1 (top-p 1)",
        "- questions: first 1000 of each set",
        "- settings: the base model from runs/x/adapters/dart_adapters.json, the rest configs/evaluate.py's defaults"]
    sql = {"task": "sql", "policy": "p", "model": "m", "n_samples": 1, "temperature": 0.0, "db_root": "/dbs",
           "sql_timeout_s": 5.0}
    lines = header({"setup": sql, "datasets": {}})
    assert lines[1] == "- tool: SQLite over the databases in /dbs, 5 s per query"
    assert lines[2] == "- protocol: SkyRL-SQL (sql)"
    assert lines[3] == "- sampling: greedy (temperature 0), 1 sample per question"
