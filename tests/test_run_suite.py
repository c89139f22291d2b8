"""tests/run_suite.py, the runner CI uses: its schedule, exit status and the ALONE rule, on real pytest
processes over throwaway test directories."""

import importlib.util
import os
import sys

import pytest

_SPEC = importlib.util.spec_from_file_location("run_suite", os.path.join(os.path.dirname(__file__), "run_suite.py"))
run_suite = importlib.util.module_from_spec(_SPEC)
_SPEC.loader.exec_module(run_suite)


def test_schedule_puts_longest_first_and_alone_groups_last():
    # as groups() lists them: directories sorted, then the top-level files as one group
    chosen = ["tests/adapters", "tests/analysis", "tests/data", "tests/rl", "tests/rollout", "tests/tools",
              "tests/test_cli.py tests/test_layers.py"]
    order = run_suite.schedule(chosen)
    assert order[:3] == ["tests/rl", "tests/rollout", "tests/analysis"]  # LONGEST_FIRST's order
    assert order[-1] == "tests/tools"
    # the unranked groups keep directory order between them
    assert order[3:-1] == ["tests/adapters", "tests/data", "tests/test_cli.py tests/test_layers.py"]
    assert run_suite.name("tests/test_cli.py tests/test_layers.py") == "top"


def _group(root, name, body):
    d = root / name
    d.mkdir()
    (d / f"test_{name}.py").write_text(body)
    return str(d)


@pytest.mark.parametrize("jobs", [1, 2])
def test_run_reports_every_group_and_waits_for_the_others_before_an_alone_group(tmp_path, jobs, capsys):
    # each group appends (name, start, end) to one file, so the overlap of groups can be checked
    stamp = tmp_path / "stamps.txt"
    body = ("import os, time\n"
            "def test_it():\n"
            "    t0 = time.time(); time.sleep(SLEEP)\n"
            "    with open(STAMP, 'a') as f:\n"
            "        f.write(f'{os.path.basename(os.path.dirname(__file__))} {t0} {time.time()}\\n')\n"
            "    assert OK\n").replace("STAMP", repr(str(stamp)))
    slow = _group(tmp_path, "slowgroup", body.replace("SLEEP", "1.5").replace("OK", "True"))
    bad = _group(tmp_path, "badgroup", body.replace("SLEEP", "0.2").replace("OK", "False"))
    alone = _group(tmp_path, "tools", body.replace("SLEEP", "0.2").replace("OK", "True"))  # "tools" is in ALONE
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)}
    results = run_suite.run([alone, bad, slow], ["-q", "-p", "no:cacheprovider"], env, jobs)
    by_group = {os.path.basename(g): (rc, dt, rss) for g, rc, dt, rss in results}
    assert set(by_group) == {"slowgroup", "badgroup", "tools"}
    assert by_group["badgroup"][0] == 1 and by_group["slowgroup"][0] == 0 and by_group["tools"][0] == 0
    assert all(dt > 0 and rss > 0 for _, dt, rss in by_group.values())
    spans = {n: (float(a), float(b)) for n, a, b in (line.split() for line in stamp.read_text().splitlines())}
    assert spans["tools"][0] >= max(spans["slowgroup"][1], spans["badgroup"][1])  # alone: after both ended
    if jobs == 2:  # the two others side by side
        assert spans["badgroup"][0] < spans["slowgroup"][1] and spans["slowgroup"][0] < spans["badgroup"][1]
        out = capsys.readouterr().out
        assert out.count(f"=== {tmp_path}") == 3 and "1 failed" in out  # each group's buffered output, printed whole
