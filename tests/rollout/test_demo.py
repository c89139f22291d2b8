"""`python -m launch.rollout` shows a newcomer real tool calls: on the embedded SmolLM2 it starts from
the shipped QA warm start (the raw model never writes the tags), says so, and prints the search and
the retrieved passage; NL2SQL has its own shipped warm start."""

import pytest

from dart_jax.run.demo import default_warm_start
from launch import rollout


@pytest.mark.slow  # CI budget: kept out of the default run (python -m pytest -m slow)
def test_rollout_demo_starts_from_the_shipped_warm_start(capsys):
    assert default_warm_start("smollm2-135m-instruct", "qa") == "data/warm_start/smollm2-135m-nq"
    assert default_warm_start("smollm2-135m-instruct", "sql") == "data/warm_start/smollm2-135m-spider"
    assert default_warm_start("qwen2.5-3b", "qa") == ""
    assert rollout.main(["--n", "1", "--temperature", "0", "--max-turns", "1", "--max-tokens-per-turn", "48"]) == 0
    out = capsys.readouterr().out
    assert "warm start: data/warm_start/smollm2-135m-nq" in out
    assert "tool calls=1" in out and "turn 0: tool" in out and "Doc 1(Title:" in out
