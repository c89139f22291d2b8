"""tests/run_suite.py, the runner CI uses: its schedule, exit status and the ALONE rule, on real pytest
processes over throwaway test directories."""

import importlib.util
import os

import pytest

_SPEC = importlib.util.spec_from_file_location("run_suite", os.path.join(os.path.dirname(__file__), "run_suite.py"))
run_suite = importlib.util.module_from_spec(_SPEC)
_SPEC.loader.exec_module(run_suite)
PYTEST_ARGS = ["-q", "-p", "no:cacheprovider"]


def test_schedule_puts_longest_first_and_alone_groups_last():
    # as groups() lists them: directories sorted, then the top-level files as one group
    chosen = ["tests/adapters", "tests/analysis", "tests/data", "tests/experiments", "tests/rl", "tests/rollout",
              "tests/tools", "tests/test_cli.py tests/test_layers.py"]
    order = run_suite.schedule(chosen)
    assert order[:5] == ["tests/rl", "tests/rollout", "tests/experiments",  # LONGEST_FIRST's order
                         "tests/test_cli.py tests/test_layers.py", "tests/adapters"]
    assert order[-1] == "tests/tools"
    # the unranked groups keep directory order between them
    assert order[5:-1] == ["tests/analysis", "tests/data"]
    assert run_suite.name("tests/test_cli.py tests/test_layers.py") == "top"


def _group(root, name, body):
    d = root / name
    d.mkdir()
    (d / f"test_{name}.py").write_text(body)
    return str(d)


# a group's one test: it stamps (group, start, end, whether its partner group was running) into a file;
# with PARTNER set it waits up to 60 s for the partner to start, so two groups run side by side meet
# whatever the machine's load
BODY = """import os, time
def test_it():
    here = os.path.dirname(__file__)
    name = os.path.basename(here)
    t0 = time.time()
    open(os.path.join(os.path.dirname(here), name + '.started'), 'w').close()
    partner, met = PARTNER, None
    if partner:
        while not os.path.exists(os.path.join(os.path.dirname(here), partner + '.started')) and time.time() < t0 + 60:
            time.sleep(0.05)
        met = os.path.exists(os.path.join(os.path.dirname(here), partner + '.started'))
    with open(STAMP, 'a') as f:
        f.write(f'{name} {t0} {time.time()} {met}\\n')
    assert OK, 'deliberate failure'
"""


def _body(stamp, partner, ok):
    return BODY.replace("STAMP", repr(str(stamp))).replace("PARTNER", repr(partner)).replace("OK", repr(ok))


@pytest.mark.parametrize("jobs", [1, 2])
def test_run_reports_every_group_and_waits_for_the_others_before_an_alone_group(tmp_path, jobs, capfd):
    stamp = tmp_path / "stamps.txt"
    pair = jobs == 2
    slow = _group(tmp_path, "slowgroup", _body(stamp, "badgroup" if pair else "", True))
    bad = _group(tmp_path, "badgroup", _body(stamp, "slowgroup" if pair else "", False))
    alone = _group(tmp_path, "tools", _body(stamp, "", True))  # "tools" is in ALONE
    results = run_suite.run([alone, bad, slow], PYTEST_ARGS, dict(os.environ), jobs)
    by_group = {os.path.basename(g): (rc, dt) for g, rc, dt, *_ in results}
    assert set(by_group) == {"slowgroup", "badgroup", "tools"}
    assert by_group["badgroup"][0] == 1 and by_group["slowgroup"][0] == 0 and by_group["tools"][0] == 0
    assert [os.path.basename(g) for g, *_ in results][-1] == "tools"
    # each group's CPU seconds are its own process's (a pytest start-up is ~0.5 CPU-s on this host), never
    # more than its wall time on every core
    for g, _, dt, _, cpu in results:
        assert 0.1 < cpu < dt * (os.cpu_count() or 1) + 0.5, (g, cpu, dt)
    spans = {n: (float(a), float(b), met) for n, a, b, met in (line.split() for line in stamp.read_text().splitlines())}
    assert spans["tools"][0] >= max(spans["slowgroup"][1], spans["badgroup"][1])  # alone: after both ended
    out = capfd.readouterr().out
    assert "deliberate failure" in out
    if pair:  # the two others side by side, each group's buffered output printed whole under its header
        assert spans["slowgroup"][2] == "True" and spans["badgroup"][2] == "True"
        assert out.count(f"=== {tmp_path}") == 3
        bad_part = out[out.index(f"=== {bad} "):].split(f"=== {tmp_path}")[1]  # up to the next group's header
        assert "deliberate failure" in bad_part and "1 failed" in bad_part


def test_main_returns_the_first_failing_groups_status(tmp_path, monkeypatch, capfd):
    empty = _group(tmp_path, "emptygroup", "X = 1\n")  # collects nothing: pytest's exit 5, a pass here
    dies = _group(tmp_path, "diesgroup", "import os\ndef test_it():\n    os._exit(3)\n")
    bad = _group(tmp_path, "badgroup", "def test_it():\n    assert False\n")
    monkeypatch.setattr(run_suite, "groups", lambda: [bad, dies, empty])
    assert run_suite.main(["--jobs", "2", *PYTEST_ARGS]) == 1  # badgroup comes first in groups()' order
    out = capfd.readouterr().out
    assert "FAIL (exit 1)" in out and "FAIL (exit 3)" in out and "emptygroup" in out.split("=== summary")[1]
    monkeypatch.setattr(run_suite, "groups", lambda: [empty, dies, bad])
    assert run_suite.main(["--jobs", "1", *PYTEST_ARGS]) == 3
    monkeypatch.setattr(run_suite, "groups", lambda: [empty])
    assert run_suite.main(PYTEST_ARGS) == 0
