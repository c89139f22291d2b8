"""One CLI convention for launch/: every command is absl flags on its own FlagValues, `--help`
prints its purpose with a runnable example and its flags, a bad flag exits 2 naming it, and
commands with a config take `--config=FILE[:ARG]` plus `--config.x=y` overrides."""

import importlib
import os

import pytest

ROOT = os.path.normpath(os.path.join(os.path.dirname(__file__), ".."))
COMMANDS = sorted(n[:-3] for n in os.listdir(os.path.join(ROOT, "launch")) if n.endswith(".py") and not n.startswith("_"))
WITH_CONFIG = {"train", "sft", "evaluate", "sweep", "cea", "grad_angles", "methods"}


def test_the_commands_are_the_ones_expected():
    assert set(COMMANDS) == {"bench", "build_corpus", "build_index", "cea", "crosscheck", "evaluate", "grad_angles",
                             "init_adapters", "methods", "rollout", "serve_retriever", "sft", "sweep", "train"}


@pytest.mark.parametrize("name", COMMANDS)
def test_help_bad_flags_and_config(name, capsys):
    mod = importlib.import_module(f"launch.{name}")
    assert mod.CLI.prog == f"launch.{name}"
    with pytest.raises(SystemExit) as e:
        mod.main(["--help"])
    assert e.value.code == 0
    out = capsys.readouterr().out
    assert f"python -m launch.{name}" in out and "flags:" in out  # a runnable example and the flags
    with pytest.raises(SystemExit) as e:
        mod.main(["--no-such-flag=1"])
    assert e.value.code == 2 and "no-such-flag" in capsys.readouterr().err
    assert (mod.CLI.config is not None) == (name in WITH_CONFIG)


def test_config_overrides_parse():
    from launch import train
    train.CLI.parse(["--config=configs/quickstart.py", "--config.train.steps=3", "--config.optim.lr=0.5"])
    assert train.CLI.config.value.train.steps == 3 and train.CLI.config.value.optim.lr == 0.5
    train.CLI.parse(["--config=configs/quickstart.py"])  # a second parse starts from the defaults again
    assert train.CLI.config.value.train.steps == 24
    with pytest.raises(SystemExit) as e:
        train.main([])
    assert e.value.code == 2  # --config is required
