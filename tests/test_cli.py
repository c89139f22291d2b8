"""One CLI convention for launch/: every command is absl flags on its own FlagValues, `--help`
prints its purpose with a runnable example and its flags, a bad flag exits 2 naming it, and
commands with a config take `--config=FILE[:ARG]` plus `--config.x=y` overrides.

What a newcomer meets: every user mistake (missing config file, misspelt override key, wrong type,
a tuple given twice, missing model, port in use) is one line `launch.X: what is wrong; what to do`
on stderr with exit status 2 and nothing written; `--verbose` adds the traceback; a bug keeps its
traceback. Quiet logs, one flag spelling, valid markdown in crosscheck reports, and user-facing text
that cites only the paper's sections by name and this repository's files."""

import importlib
import io
import logging
import os
import re
import socket
import subprocess
import sys

import pytest

from launch._cli import Command

ROOT = os.path.normpath(os.path.join(os.path.dirname(__file__), ".."))
COMMANDS = sorted(n[:-3] for n in os.listdir(os.path.join(ROOT, "launch"))
                  if n.endswith(".py") and not n.startswith("_"))
WITH_CONFIG = {"train", "sft", "evaluate", "sweep", "cea", "grad_angles", "methods", "preflight"}


def test_the_commands_are_the_ones_expected():
    assert set(COMMANDS) >= {"bench", "build_corpus", "build_index", "cea", "crosscheck", "evaluate", "grad_angles",
                             "init_adapters", "methods", "rollout", "serve_retriever", "sft", "sweep", "train"}


@pytest.mark.parametrize("name", COMMANDS)
def test_help_bad_flags_and_config(name, capsys):
    mod = importlib.import_module(f"launch.{name}")
    assert mod.CLI.prog == f"launch.{name}"
    with pytest.raises(SystemExit) as e:
        mod.main(["--help"])
    assert e.value.code == 0
    out = capsys.readouterr().out
    assert f"python -m launch.{name}" in out and "flags:" in out and "--[no]verbose" in out  # example, flags
    with pytest.raises(SystemExit) as e:
        mod.main(["--no-such-flag=1"])
    err = capsys.readouterr().err
    assert e.value.code == 2 and "no-such-flag" in err and len(err.strip().splitlines()) == 1
    assert (mod.CLI.config is not None) == (name in WITH_CONFIG)


@pytest.mark.parametrize("name", COMMANDS)
def test_every_command_reports_mistakes_through_the_common_wrapper(name):
    """`python -m launch.X` ends in `CLI.run(main)`: the one-line report and exit status 2."""
    source = open(os.path.join(ROOT, "launch", f"{name}.py")).read()
    assert source.rstrip().endswith('if __name__ == "__main__":\n    CLI.run(main)'), name


def test_multi_word_flags_are_spelled_with_dashes():
    """One spelling across commands: --max-new-tokens, --rollout-batch, never --rollout_batch."""
    underscored = {name: [f for f in importlib.import_module(f"launch.{name}").CLI.flags
                          if "_" in f and not f.startswith("config.")] for name in COMMANDS}
    assert not {k: v for k, v in underscored.items() if v}, underscored


def test_config_overrides_parse():
    from launch import train
    train.CLI.parse(["--config=configs/quickstart.py", "--config.train.steps=3", "--config.optim.lr=0.5"])
    assert train.CLI.config.value.train.steps == 3 and train.CLI.config.value.optim.lr == 0.5
    train.CLI.parse(["--config=configs/quickstart.py"])  # a second parse starts from the defaults again
    assert train.CLI.config.value.train.steps == 24
    train.CLI.parse(["--config=configs/quickstart.py", "--config.mesh.shape=1", "--config.mesh.shape=2"])
    assert train.CLI.config.value.mesh.shape == (1, 2)  # repeated single items still build a tuple
    with pytest.raises(SystemExit) as e:
        train.main([])
    assert e.value.code == 2  # --config is required


# (extra argv, what stderr's one line must hold); quickstart's train.steps is 24, optim.lr 2e-4
CONFIG_MISTAKES = [
    (["--config=configs/quickstat.py"],
     "launch.train: --config=configs/quickstat.py: no such config file; did you mean configs/quickstart.py?"),
    (["--config=configs/quickstart.py", "--config.train.step=3"],
     "launch.train: --config.train.step=3: no field train.step; did you mean train.steps?"),
    (["--config=configs/quickstart.py", "--config.trian.steps=3"],
     "launch.train: --config.trian.steps=3: no field trian; did you mean train?"),
    (["--config=configs/quickstart.py", "--config.train.steps=abc"],
     "launch.train: --config.train.steps=abc: train.steps takes an integer (the config has 24); "
     "e.g. --config.train.steps=24"),
    (["--config=configs/quickstart.py", "--config.optim.lr=fast"],
     "launch.train: --config.optim.lr=fast: optim.lr takes a number (the config has 0.0002); "
     "e.g. --config.optim.lr=0.0002"),
    (["--config=configs/quickstart.py", "--config.mesh.shape=1,2,1", "--config.mesh.shape=2,1,1"],
     "launch.train: --config.mesh.shape given 2 times (1,2,1 and 2,1,1): the tuples would be joined into one; "
     "give the whole tuple once, e.g. --config.mesh.shape=2,1,1"),
    (["--config=configs/quickstart.py", "--config.mesh.shape", "1,1,1", "--config.mesh.shape", "3,1,1"],
     "launch.train: --config.mesh.shape given 2 times (1,1,1 and 3,1,1): the tuples would be joined into one; "
     "give the whole tuple once, e.g. --config.mesh.shape=3,1,1"),
    (["--config=configs/quickstart.py", "--config.data.train[3].path=x.parquet"],
     "launch.train: --config.data.train[3].path=x.parquet: data.train has 1 entry, no [3]; indices run from 0 to 0"),
    (["--config.train.steps=3"],
     "launch.train: --config.train.steps=3 changes a config, but no --config=FILE names one; "
     "e.g. --config=configs/quickstart.py --config.train.steps=3"),
    (["--config=configs/quickstart.py", "--config=configs/cea.py"],
     "launch.train: --config given 2 times (configs/quickstart.py, configs/cea.py); give one config file and "
     "change its fields with --config.section.field=value"),
]


@pytest.mark.parametrize("argv,line", CONFIG_MISTAKES,
                         ids=["file", "key", "section", "int", "float", "tuple", "tuple-spaced", "index", "no-config",
                              "two-configs"])
def test_config_mistakes_are_one_line_exit_2_and_write_nothing(argv, line, tmp_path, capsys):
    from launch import train
    out = tmp_path / "run"
    with pytest.raises(SystemExit) as e:
        train.CLI.run(train.main, argv + [f"--config.output.dir={out}"])
    assert e.value.code == 2
    assert capsys.readouterr().err == line + "\n"
    assert not out.exists()


def test_a_missing_config_file_from_the_shell(tmp_path):
    """The real `python -m`: one line on stderr, status 2, no traceback, nothing written."""
    out = tmp_path / "run"
    run = subprocess.run([sys.executable, "-m", "launch.train", "--config=configs/nope.py",
                          f"--config.output.dir={out}"], cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert run.returncode == 2
    assert run.stderr == ("launch.train: --config=configs/nope.py: no such config file; the configs are configs/*.py "
                          "(e.g. --config=configs/quickstart.py)\n")
    assert not out.exists()


def test_a_refusal_raised_as_system_exit_is_one_line_with_status_2(capsys):
    """`raise SystemExit("launch.X: ...")` alone would exit 1; through the wrapper it is a mistake."""
    from launch import init_adapters
    with pytest.raises(SystemExit) as e:
        init_adapters.CLI.run(init_adapters.main, ["--out=/nonexistent/never-written"])
    assert e.value.code == 2
    assert capsys.readouterr().err == ("launch.init_adapters: --model and --out are required; e.g. "
                                       "--model=smollm2-135m-instruct --out=runs/dart0\n")


def test_verbose_adds_the_traceback(capsys):
    from launch import train
    with pytest.raises(SystemExit) as e:
        train.CLI.run(train.main, ["--config=configs/quickstart.py", "--config.train.step=3", "--verbose"])
    err = capsys.readouterr().err
    assert e.value.code == 2 and "Traceback (most recent call last)" in err
    assert err.strip().splitlines()[-1] == ("launch.train: --config.train.step=3: no field train.step; "
                                            "did you mean train.steps?")


def test_a_missing_model_is_one_line(tmp_path, capsys):
    from launch import init_adapters
    out = tmp_path / "adapters"
    argv = ["--model=no-such-org/no-such-model", f"--out={out}"]
    with pytest.raises(SystemExit) as e:
        init_adapters.CLI.run(init_adapters.main, argv)
    err = capsys.readouterr().err
    assert e.value.code == 2 and len(err.strip().splitlines()) == 1, err
    assert err.startswith("launch.init_adapters: ") and "no-such-org/no-such-model" in err
    assert not out.exists()
    with pytest.raises(SystemExit) as e:
        init_adapters.CLI.run(init_adapters.main, argv + ["--verbose"])
    err = capsys.readouterr().err
    assert e.value.code == 2 and "Traceback (most recent call last)" in err and "NotFound" in err


@pytest.mark.parametrize("preflight", [True, False], ids=["preflight", "skip-preflight"])
def test_a_missing_dataset_is_named_exit_2_and_nothing_written(preflight, tmp_path, capsys):
    """Caught by the preflight before anything loads, or (--skip-preflight) by the data reader, reported
    through the common wrapper in one line."""
    from launch import train
    out, data = tmp_path / "run", tmp_path / "absent" / "train.parquet"
    argv = ["--config=configs/quickstart.py", f"--config.data.train[0].path={data}", f"--config.output.dir={out}"]
    with pytest.raises(SystemExit) as e:
        train.CLI.run(train.main, argv + ([] if preflight else ["--skip-preflight"]))
    ours = [line for line in capsys.readouterr().err.splitlines() if line.startswith("launch.train: ")]
    assert e.value.code == 2 and any(str(data) in line for line in ours), ours
    assert preflight or len(ours) == 1, ours
    assert not out.exists()


@pytest.fixture(scope="module")
def tiny_index(tmp_path_factory):
    """A real faiss index over three passages, built by `python -m launch.build_index` (its stderr is
    kept: the quiet-logging check reads it)."""
    folder = tmp_path_factory.mktemp("tiny_index")
    corpus = folder / "corpus.jsonl"
    corpus.write_text("".join(f'{{"id": "{i}", "contents": "\\"{t}\\"\\n{t} is a capital."}}\n'
                              for i, t in enumerate(("Paris", "Berlin", "Rome"))))
    run = subprocess.run([sys.executable, "-m", "launch.build_index", f"--corpus={corpus}", f"--out={folder / 'idx'}"],
                         cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert run.returncode == 0, run.stderr[-3000:]
    return str(folder / "idx"), run.stderr


def test_library_chatter_is_off_by_default(tiny_index):
    """faiss's loader prints ~10 INFO lines ("Loading faiss with AVX2 support" …) on import."""
    _, stderr = tiny_index
    assert "faiss.loader" not in stderr and "Loading faiss" not in stderr, stderr
    assert " INFO dart_jax." in stderr  # the command's own INFO lines remain


def test_a_port_in_use_is_one_line(tiny_index, capsys):
    from launch import serve_retriever
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen(1)
        port = taken.getsockname()[1]
        with pytest.raises(SystemExit) as e:
            serve_retriever.CLI.run(serve_retriever.main, [f"--index={tiny_index[0]}", f"--port={port}"])
    err = [line for line in capsys.readouterr().err.splitlines() if line.startswith("launch.")]
    assert e.value.code == 2 and len(err) == 1, err
    assert "address already in use" in err[0] and str(port) in err[0] and "--port" in err[0]


def _shell(module: str, *argv: str, timeout: int = 300) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", f"launch.{module}", *argv], cwd=ROOT, capture_output=True, text=True,
                          timeout=timeout)


# a setting out of its range (run.spec's checks), from the real command line: one line, status 2, before any
# file of output.dir is written (train.steps=-3 used to run zero steps and write a whole run directory)
SETTING_MISTAKES = [
    ("train", ["--config=configs/quickstart.py", "--config.train.steps=-3"],
     "launch.train: train.steps=-3 must be ≥ 1; set --config.train.steps"),
    ("train", ["--config=configs/quickstart.py", "--config.train.steps=-3", "--skip-preflight"],
     "launch.train: train.steps=-3 must be ≥ 1; set --config.train.steps"),
    ("train", ["--config=configs/quickstart.py", "--config.train.group_size=0", "--skip-preflight"],
     "launch.train: train.group_size=0 must be ≥ 1; set --config.train.group_size"),
    ("train", ["--config=configs/quickstart.py", "--config.output.keep=0"],
     "launch.train: output.keep=0 must be ≥ 1; set --config.output.keep"),
    ("train", ["--config=configs/quickstart.py", "--config.optim.lr=-1.0"],
     "launch.train: optim.lr (-1.0) and optim.warmup_steps (0) must be ≥ 0"),
    ("sft", ["--config=configs/sft_quickstart.py", "--config.sft.epochs=0"],
     "launch.sft: sft.epochs=0 must be ≥ 1; set --config.sft.epochs"),
]


@pytest.mark.parametrize("module,argv,line", SETTING_MISTAKES,
                         ids=["steps", "steps-skip-preflight", "group-size", "keep", "lr", "sft-epochs"])
def test_a_setting_out_of_range_is_one_line_before_anything_is_written(module, argv, line, tmp_path):
    out = tmp_path / "run"
    run = _shell(module, *argv, f"--config.output.dir={out}")
    assert (run.returncode, run.stderr) == (2, line + "\n")
    assert not out.exists()


@pytest.mark.parametrize("flag,line", [
    ("--limit=-5", "launch.evaluate: --limit=-5: must be ≥ 0 (0 or unset: every question)"),
    ("--n-samples=0", "launch.evaluate: --n-samples=0: must be ≥ 1"),
    ("--batch=-1", "launch.evaluate: --batch=-1: must be ≥ 1"),
    ("--top-k=-2", "launch.evaluate: --top-k=-2: must be ≥ 0 (0: off)"),
    ("--temperature=-0.5", "launch.evaluate: --temperature=-0.5: must be ≥ 0 (0: greedy)"),
    ("--top-p=1.5", "launch.evaluate: --top-p=1.5: must be in (0, 1] (1: off)"),
], ids=["limit", "n-samples", "batch", "top-k", "temperature", "top-p"])
def test_evaluate_refuses_a_flag_out_of_range(flag, line, tmp_path, capsys):
    """--limit=-5 used to evaluate all but five questions of each set; 0 (or no --limit) is every question."""
    from launch import evaluate
    out = tmp_path / "eval"
    with pytest.raises(SystemExit) as e:
        evaluate.CLI.run(evaluate.main, [flag, f"--out={out}"])
    assert (e.value.code, capsys.readouterr().err) == (2, line + "\n")
    assert not out.exists()
    assert "0 or unset: all" in evaluate.CLI.flags["limit"].help


def test_evaluate_negative_limit_from_the_shell(tmp_path):
    out = tmp_path / "eval"
    run = _shell("evaluate", "--limit=-5", f"--out={out}")
    line = "launch.evaluate: --limit=-5: must be ≥ 0 (0 or unset: every question)"
    assert (run.returncode, run.stderr) == (2, line + "\n")
    assert not out.exists()


def test_a_port_in_use_is_refused_before_anything_loads():
    """The port is probed first: with an index that does not exist, the port is still what is reported,
    at once (it used to be found after the index and encoder had loaded, ~15 s)."""
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen(1)
        port = taken.getsockname()[1]
        run = _shell("serve_retriever", "--index=/nonexistent/no-index", f"--port={port}", timeout=120)
    assert run.returncode == 2 and run.stderr == (f"launch.serve_retriever: address already in use: 127.0.0.1:{port}; "
                                                  "the port is taken: stop what listens on it, or pick another "
                                                  "--port\n")
    run = _shell("serve_retriever", "--index=/nonexistent/no-index", "--port=70000", timeout=120)
    assert (run.returncode, run.stderr) == (2, "launch.serve_retriever: --port=70000: a port is 0 to 65535 "
                                               "(0: any free one)\n")


def test_a_bug_keeps_its_traceback():
    """Only user mistakes are turned into one line: anything else propagates (Python prints it)."""
    def broken(argv):
        return {}["a key the code forgot"]
    with pytest.raises(KeyError):
        Command("launch.demo", "demo").run(broken, [])
    with pytest.raises(SystemExit) as e:
        Command("launch.demo", "demo").run(lambda argv: 3, [])
    assert e.value.code == 3  # main's own status passes through


def test_the_mistake_classes_exist():
    """The wrapper names the user-mistake classes by module.qualname (nothing imported at --help):
    each name must still be a real exception class, or the mistake would show as a traceback again."""
    import builtins

    from launch._cli import MISTAKES
    for name in MISTAKES:
        module, cls = name.rsplit(".", 1)
        obj = getattr(builtins if module == "builtins" else importlib.import_module(module), cls)
        assert isinstance(obj, type) and issubclass(obj, Exception) and f"{obj.__module__}.{obj.__qualname__}" == name


def test_ctrl_c_is_one_line(capsys):
    def interrupted(argv):
        raise KeyboardInterrupt
    with pytest.raises(SystemExit) as e:
        Command("launch.demo", "demo").run(interrupted, [])
    assert e.value.code == 130 and capsys.readouterr().err == "launch.demo: interrupted\n"


def test_repeated_notes_are_shown_once_and_the_libraries_are_quiet():
    from launch._log import setup_logging
    setup_logging(verbose=False)
    stream = io.StringIO()
    handler = logging.getLogger().handlers[0]
    handler.setStream(stream)
    log = logging.getLogger("dart_jax.parallel.mesh")
    for _ in range(5):
        log.info("replicated, not divisible by their mesh axes: heads=9 over tensor=2")
    logging.getLogger("dart_jax.data.readers").info("a different note")
    logging.getLogger("faiss.loader").info("Loading faiss with AVX2 support.")
    logging.getLogger("dart_jax.run.checkpoint").warning("a warning")
    logging.getLogger("dart_jax.run.checkpoint").warning("a warning")
    lines = stream.getvalue().splitlines()
    assert sum("heads=9" in line for line in lines) == 1
    assert sum("a different note" in line for line in lines) == 1
    assert sum("a warning" in line for line in lines) == 2  # warnings are never collapsed
    assert not any("faiss" in line for line in lines)
    setup_logging(verbose=True)
    stream = io.StringIO()
    logging.getLogger().handlers[0].setStream(stream)
    for _ in range(2):
        log.info("replicated, not divisible by their mesh axes: heads=9 over tensor=2")
    logging.getLogger("faiss.loader").info("Loading faiss with AVX2 support.")
    assert stream.getvalue().count("heads=9") == 2 and "Loading faiss" in stream.getvalue()
    setup_logging(verbose=False)


def test_a_trees_sharding_notes_are_one_summary_line(caplog):
    """SmolLM2's 9 heads / 3 KV heads on tensor=2: every projection that splits heads is replicated;
    the placement says so once for the tree, not once per leaf."""
    import jax

    from dart_jax.models.config import ModelConfig
    from dart_jax.models.sharding import base_shardings
    from dart_jax.parallel.mesh import make_mesh
    cfg = ModelConfig("llama", 49152, 576, 1536, 30, 9, 3, 64, tie_word_embeddings=True)
    with caplog.at_level(logging.INFO, logger="dart_jax.parallel.mesh"):
        base_shardings(cfg, make_mesh((2, 2, 2), jax.devices()[:8]))
    notes = [r.getMessage() for r in caplog.records if r.name == "dart_jax.parallel.mesh"]
    assert len(notes) == 1, notes
    assert "heads=9 over tensor=2" in notes[0] and "kv_heads=3 over tensor=2" in notes[0]


def test_crosscheck_report_is_valid_markdown():
    """Parsed with markdown-it (GitHub tables): one table, a header of 7 cells, every row 7 cells, the
    measures' `|` kept inside their cells."""
    from markdown_it import MarkdownIt

    from dart_jax.parity.check_report import CheckReport, quantity
    qs = [quantity("advantages", "advantages", [0.5, -0.5], [0.5, -0.5], "float32"),
          quantity("loss | token-mean", "loss", [1.0], [1.0001], "float32"),
          quantity("grad (A, B)", "grad", [1.0, 2.0], [1.0, 2.5], "float32")]
    rep = CheckReport("loss", "m", "float32", "verl", {}, ["loss.micro_mode: global → verl_microbatch_mean"], qs, 1.0)
    tokens = MarkdownIt("commonmark").enable("table").parse(rep.markdown())
    assert [t.type for t in tokens].count("table_open") == 1
    rows, row = [], None
    for t in tokens:
        if t.type == "tr_open":
            row = []
        elif t.type == "inline" and row is not None:
            row.append(t.content)
        elif t.type == "tr_close":
            rows.append(row)
            row = None
    assert rows[0] == ["quantity", "measure", "value", "max |torch|", "tol fp32", "tol bf16", "pass"]
    assert len(rows) == 4 and all(len(r) == 7 for r in rows), rows
    assert rows[2][:2] == ["loss | token-mean", "max |Δ| / max |torch|"]
    assert [r[6] for r in rows[1:]] == ["PASS", "PASS", "FAIL"]


@pytest.mark.slow  # ~60 s here (the SmolLM2 tokenizer fixture, two real checks): python -m pytest -m slow
def test_crosscheck_runs_several_checks_with_progress(tiny_smollm_dir, tmp_path, capsys):
    from launch import crosscheck
    code = crosscheck.main(["model", "adapters", "--model", tiny_smollm_dir, "--max-new-tokens", "4",
                            "--out", str(tmp_path)])
    err = capsys.readouterr().err
    assert code == 0 and "2/2" in err and "crosscheck" in err
    for check in ("model", "adapters"):
        assert (tmp_path / check / "report.md").is_file() and (tmp_path / check / "report.json").is_file()


def test_crosscheck_refuses_unknown_or_repeated_checks(capsys):
    from launch import crosscheck
    for checks in (["model", "model"], ["modle"]):
        with pytest.raises(SystemExit) as e:
            crosscheck.CLI.run(crosscheck.main, checks + ["--model=smollm2-135m-instruct"])
        assert e.value.code == 2
        assert capsys.readouterr().err == (f"launch.crosscheck: checks {checks}: name each of ('model', 'adapters', "
                                           "'loss', 'step') at most once, or all\n")


# user-facing text: what a user reads (README, docs, configs, launch/ --help, dart_jax docstrings)
CITATION = re.compile(r"\b(?:METHOD|REFERENCE)(?:\.md)?\s*§|\b(?:METHOD|REFERENCE)\.md\b|shared/docs|"
                      r"(?<!SkyRL )\b[Ii]ssues?\s+#?\d+|\(#\d+\)")


def user_facing_files() -> list[str]:
    out = [os.path.join(ROOT, "README.md")]
    for folder, _, names in os.walk(os.path.join(ROOT, "docs")):
        if os.path.join("docs", "results", "data") in folder:
            continue  # archived run outputs, not prose
        out += [os.path.join(folder, n) for n in names if n.endswith(".md")]
    for top in ("configs", "launch", "dart_jax"):
        for folder, _, names in os.walk(os.path.join(ROOT, top)):
            out += [os.path.join(folder, n) for n in names if n.endswith(".py")]
    return sorted(out)


def test_user_facing_text_cites_only_what_the_user_has():
    """"METHOD §2", "REFERENCE §5" and "issue 19" point at files and a tracker the user does not have:
    cite the paper's sections by name and this repository's files instead."""
    found = []
    for path in user_facing_files():
        text = open(path, encoding="utf-8").read()
        for m in CITATION.finditer(text):
            line = text.count("\n", 0, m.start()) + 1
            found.append(f"{os.path.relpath(path, ROOT)}:{line}: {m.group(0)!r}")
    assert not found, "\n".join(found)


def test_the_citation_pattern_catches_each_form():
    for text in ("(METHOD §2)", "REFERENCE §1–6", "REFERENCE.md §3", "see METHOD.md", "issue 19", "(issue 20)",
                 "issues 18", "Issue 20's bar", "../shared/docs/DESIGN.md"):
        assert CITATION.search(text), text
    for text in ("SkyRL issue 2451", "paper_qa.py:METHOD,MODEL", "REFERENCE = 'warm_start'", "Llama 3.1 paper, §3.1"):
        assert not CITATION.search(text), text
