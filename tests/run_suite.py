"""The test suite as CI runs it: one pytest process per test directory, in order, then a summary.

    python tests/run_suite.py                 # README's test command: every group, `-m "not slow"`
    python tests/run_suite.py -m slow         # pytest arguments are passed on; -m replaces "not slow"
    python tests/run_suite.py --only rl,sft   # some groups

Why processes: XLA:CPU (jaxlib 0.10.2) segfaults compiling the GRPO train step of
tests/sft/test_sql_quickstart.py when ~300 other tests have compiled their programs in the same
process, reproducibly on this host and on CI (Python traceback: jax compiler.backend_compile_and_load
<- pxla compile <- rl/stages.py's jitted update), while the same test, and tests/sft alone, pass in a
fresh process. A fresh process per directory bounds what one XLA process accumulates, keeps each
group's fixtures, and costs a few seconds of start-up per group. The groups share one on-disk XLA
compilation cache (DART_JAX_TEST_XLA_CACHE, read by conftest.py): a program another group compiled is
loaded, not compiled again. Every group runs even when one fails; the exit status is
the first non-zero one.
"""

from __future__ import annotations

import argparse
import os
import shutil
import subprocess
import sys
import tempfile
import time

ROOT = os.path.dirname(os.path.abspath(__file__))


def groups() -> list[str]:
    """Each test directory, then the top-level test files as one group."""
    dirs = sorted(d for d in os.listdir(ROOT) if os.path.isdir(os.path.join(ROOT, d))
                  and not d.startswith(("_", ".")) and any(f.startswith("test_") for f in os.listdir(os.path.join(ROOT, d))))
    files = sorted(f for f in os.listdir(ROOT) if f.startswith("test_") and f.endswith(".py"))
    return [os.path.join("tests", d) for d in dirs] + ([" ".join(os.path.join("tests", f) for f in files)] if files else [])


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--only", default="", help="comma-separated group names (directories under tests/, 'top' for "
                                                "the top-level files)")
    args, pytest_args = ap.parse_known_args(argv)
    if not pytest_args:
        pytest_args = ["-q"]
    if "-m" not in pytest_args and not any(a.startswith("-m") and len(a) > 2 for a in pytest_args):
        pytest_args = ["-m", "not slow", *pytest_args]  # the default run; `-m slow` etc. replaces it
    chosen = groups()
    if args.only:
        want = {w.strip() for w in args.only.split(",") if w.strip()}
        names = {g: ("top" if " " in g or g.endswith(".py") else os.path.basename(g)) for g in chosen}
        unknown = want - set(names.values())
        if unknown:
            raise SystemExit(f"--only: unknown groups {sorted(unknown)}; have {sorted(names.values())}")
        chosen = [g for g in chosen if names[g] in want]
    results = []
    first_bad = 0
    # one XLA compilation cache for every group's process (tests/conftest.py), removed at the end
    cache = os.environ.get("DART_JAX_TEST_XLA_CACHE") or tempfile.mkdtemp(prefix="dart_jax_suite_xla_")
    env = {**os.environ, "DART_JAX_TEST_XLA_CACHE": cache}
    for group in chosen:
        t0 = time.time()
        print(f"=== {group}", flush=True)
        rc = subprocess.call([sys.executable, "-m", "pytest", *pytest_args, *group.split()],
                             cwd=os.path.dirname(ROOT), env=env)
        # 5: no test collected in this group (e.g. all deselected by -m): not a failure
        rc = 0 if rc == 5 else rc
        results.append((group, rc, time.time() - t0))
        if rc and not first_bad:
            first_bad = rc
    if "DART_JAX_TEST_XLA_CACHE" not in os.environ:
        shutil.rmtree(cache, ignore_errors=True)
    print("\n=== summary")
    for group, rc, dt in results:
        print(f"{'ok  ' if rc == 0 else f'FAIL (exit {rc})'} {dt:7.1f} s  {group}")
    print(f"total {sum(r[2] for r in results):.0f} s")
    return first_bad


if __name__ == "__main__":
    sys.exit(main())
