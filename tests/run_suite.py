"""The test suite as CI runs it: one pytest process per test directory, two at a time, then a summary.

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

Why two at a time (`--jobs`, default 2): most groups are bound by XLA:CPU compiling tiny models, which
runs on one core, so two groups side by side use both cores of a 2-core host. The longest groups
start first (`LONGEST_FIRST`, from CI's per-group times); groups whose tests assert wall-clock limits
(`ALONE`: the SQLite timeouts of tests/tools) run after the others with nothing beside them. Each
group's output is printed whole when it ends; the summary gives each group's wall time and the peak
resident memory of its process (rl, the largest, ~5 GiB: beside a training run that holds most of the
machine's memory, use `--jobs 1`). Two processes share the compilation cache at once: JAX writes an
entry in place without a lock, but entries are compressed, so a half-written entry read by the other
process fails to decompress, which JAX reports as a warning and compiles the program instead.

Why one torch thread (OMP_NUM_THREADS=1 when groups run side by side, unless set): torch's two
OpenMP threads spin-wait for a core the other group holds. Measured beside a 2-core job: SmolLM2's
greedy `generate` on the 4 parity prompts 11.5 s at one thread against 38-47 s at two, and
tests/checkpoints/test_gguf.py's parity test 116 s -> 79 s. XLA:CPU's own thread pool showed no such
loss (`--xla_cpu_multi_thread_eigen=false` changed nothing).
"""

from __future__ import annotations

import argparse
import os
import shutil
import subprocess
import sys
import tempfile
import time

GRACE_S = 10  # on Ctrl-C: how long the groups get to write their interrupt report before they are killed

ROOT = os.path.dirname(os.path.abspath(__file__))
# CI's per-group wall times, longest first (the clean-clone CI row of docs/performance.md); groups not named
# start after these
LONGEST_FIRST = ["rl", "serve", "rollout", "experiments", "bench", "parallel", "checkpoints", "recipes", "sft", "eval",
                 "models", "preflight", "parity", "top", "lab", "adapters", "tokenization", "run"]
# groups with wall-clock assertions (tests/tools/test_sqlite_exec.py: every call within timeout + 0.5 s)
ALONE = {"tools"}


def groups() -> list[str]:
    """Each test directory, then the top-level test files as one group."""
    dirs = sorted(d for d in os.listdir(ROOT) if os.path.isdir(os.path.join(ROOT, d))
                  and not d.startswith(("_", "."))
                  and any(f.startswith("test_") for f in os.listdir(os.path.join(ROOT, d))))
    files = sorted(f for f in os.listdir(ROOT) if f.startswith("test_") and f.endswith(".py"))
    return ([os.path.join("tests", d) for d in dirs]
            + ([" ".join(os.path.join("tests", f) for f in files)] if files else []))


def name(group: str) -> str:
    return "top" if " " in group or group.endswith(".py") else os.path.basename(group)


def schedule(chosen: list[str]) -> list[str]:
    """Longest groups first, the rest in directory order, ALONE groups last."""
    rank = {g: LONGEST_FIRST.index(name(g)) if name(g) in LONGEST_FIRST else len(LONGEST_FIRST) for g in chosen}
    return sorted(chosen, key=lambda g: (name(g) in ALONE, rank[g]))  # stable: directory order among equals


class Job:
    """One group's pytest process; its output goes to a file when others run beside it."""

    def __init__(self, group: str, pytest_args: list[str], env: dict, log_dir: str | None):
        self.group, self.t0 = group, time.time()
        # binary, and unbuffered in the child: a crashing group's last lines and its traceback, in order
        self.log = None if log_dir is None else open(os.path.join(log_dir, name(group) + ".log"), "w+b")
        if self.log is None:
            print(f"=== {group}", flush=True)
        else:
            env = {**env, "PYTHONUNBUFFERED": "1"}
        self.proc = subprocess.Popen([sys.executable, "-m", "pytest", *pytest_args, *group.split()],
                                     cwd=os.path.dirname(ROOT), env=env, stdout=self.log,
                                     stderr=subprocess.STDOUT if self.log else None)

    def show(self, note: str = "") -> None:
        """Print the group's buffered output whole (nothing when it streamed)."""
        if self.log is None:
            return
        self.log.flush()
        self.log.seek(0)
        print(f"=== {self.group} ({time.time() - self.t0:.0f} s{note})", flush=True)
        sys.stdout.buffer.write(self.log.read())
        sys.stdout.flush()
        self.log.close()

    def finish(self, status: int, usage) -> tuple[str, int, float, float, float]:
        rc = os.waitstatus_to_exitcode(status)
        self.proc.returncode = rc
        rc = 0 if rc == 5 else rc  # 5: no test collected in this group (e.g. all deselected by -m)
        dt = time.time() - self.t0
        self.show()
        # CPU seconds of the group's process and the children it waited for (torch, subprocess workers)
        cpu = usage.ru_utime + usage.ru_stime
        return self.group, rc, dt, usage.ru_maxrss / 2 ** 20, cpu  # Linux: KiB -> GiB


def run(chosen: list[str], pytest_args: list[str], env: dict,
        jobs: int) -> list[tuple[str, int, float, float, float]]:
    pending, running, results = schedule(chosen), {}, []
    jobs = max(1, min(jobs, len(pending)))  # one group: stream it
    log_dir = tempfile.mkdtemp(prefix="dart_jax_suite_logs_") if jobs > 1 else None
    try:
        while pending or running:
            alone_running = any(name(j.group) in ALONE for j in running.values())
            while pending and len(running) < jobs and not alone_running:
                if name(pending[0]) in ALONE and running:
                    break  # an ALONE group waits until the others end
                job = Job(pending.pop(0), pytest_args, env, log_dir)
                running[job.proc.pid] = job
                alone_running = name(job.group) in ALONE
            ended = False
            for pid in list(running):  # only our groups' processes: never another child of this process
                got, status, usage = os.wait4(pid, os.WNOHANG)
                if got:
                    results.append(running.pop(pid).finish(status, usage))
                    ended = True
            if not ended:
                time.sleep(0.2)
    except KeyboardInterrupt:
        # the groups got the same SIGINT (one process group): let them report where they were, then stop them
        for job in running.values():
            try:
                job.proc.wait(timeout=GRACE_S)
            except subprocess.TimeoutExpired:
                job.proc.kill()
                job.proc.wait()
            job.show(", interrupted")
        running.clear()
        raise
    finally:
        for job in running.values():  # an error in the runner itself
            job.proc.kill()
            job.proc.wait()
        if log_dir:
            shutil.rmtree(log_dir, ignore_errors=True)
    return results


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--only", default="", help="comma-separated group names (directories under tests/, 'top' for "
                                                "the top-level files)")
    ap.add_argument("--jobs", type=int, default=int(os.environ.get("DART_JAX_TEST_JOBS", "2")),
                    help="groups run side by side (default 2, or $DART_JAX_TEST_JOBS)")
    args, pytest_args = ap.parse_known_args(argv)
    if args.jobs < 1:
        raise SystemExit(f"--jobs must be at least 1, got {args.jobs}")
    if not pytest_args:
        pytest_args = ["-q"]
    if "-m" not in pytest_args and not any(a.startswith("-m") and len(a) > 2 for a in pytest_args):
        pytest_args = ["-m", "not slow", *pytest_args]  # the default run; `-m slow` etc. replaces it
    chosen = groups()
    if args.only:
        want = {w.strip() for w in args.only.split(",") if w.strip()}
        unknown = want - {name(g) for g in chosen}
        if unknown:
            raise SystemExit(f"--only: unknown groups {sorted(unknown)}; have {sorted(name(g) for g in chosen)}")
        chosen = [g for g in chosen if name(g) in want]
    # one XLA compilation cache for every group's process (tests/conftest.py), removed at the end
    cache = os.environ.get("DART_JAX_TEST_XLA_CACHE") or tempfile.mkdtemp(prefix="dart_jax_suite_xla_")
    env = {**os.environ, "DART_JAX_TEST_XLA_CACHE": cache}
    if args.jobs > 1:  # one OpenMP thread per group: see "Why one torch thread" above
        env.setdefault("OMP_NUM_THREADS", "1")
    t0 = time.time()
    try:
        results = run(chosen, pytest_args, env, args.jobs)
    finally:
        if "DART_JAX_TEST_XLA_CACHE" not in os.environ:
            shutil.rmtree(cache, ignore_errors=True)
    print(f"\n=== summary ({args.jobs} at a time)")
    for group, rc, dt, rss, cpu in results:
        status = "ok  " if rc == 0 else f"FAIL (exit {rc})"
        print(f"{status} {dt:7.1f} s  cpu {cpu:7.1f} s  peak {rss:5.1f} GiB  {group}")
    wall, cpu = time.time() - t0, sum(r[4] for r in results)
    # how busy the host's cores were: below ~90% of the cores, more groups side by side (--jobs) could help
    print(f"total {wall:.0f} s wall, {sum(r[2] for r in results):.0f} s summed over groups, {cpu:.0f} CPU-s "
          f"({cpu / max(wall, 1e-9) / (os.cpu_count() or 1):.0%} of {os.cpu_count()} cores)")
    first_bad = next((rc for group in chosen for g, rc, *_ in results if g == group and rc), 0)
    return first_bad


if __name__ == "__main__":
    sys.exit(main())
