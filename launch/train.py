"""GRPO training — DART, LoRA, full-parameter and the CEA variants — as the config says (configs/).

    python -m launch.train --config=configs/quickstart.py
    python -m launch.train --config=configs/quickstart.py --resume --config.train.steps=32
    python -m launch.train --config=configs/quickstart.py --resume --config.optim.lr=5e-6 --allow-change=optim.lr
    python -m launch.train --config=configs/paper_qa.py:dart,qwen2.5-3b-base --config.model.path=DIR \\
        --config.data.train[0].path=train.parquet --config.retriever.url=http://127.0.0.1:8000/retrieve

A new run refuses an output.dir that holds a run (--resume continues it, --overwrite replaces it).
--resume runs the settings that wrote the run: one that differs from its run_config.json (a seed, a
learning rate, ...) is refused, named old → new, unless --allow-change names it (then recorded in
provenance.jsonl); the run's length, output paths, cadences and layout may change freely.
Before any model loads it runs launch.preflight's checks (retriever, databases, datasets, weights, the
mesh against the devices, the memory per device on an accelerator) and stops with exit status 2 on a
failure; --skip-preflight skips them.

Multi-process (multi-host): the same command on every process, with --coordinator=HOST:PORT
--num-processes=N --process-id=I, or with --distributed under SLURM / Open MPI / a Cloud TPU pod
(jax's cluster detection; a SLURM or Open MPI job step with several tasks is detected without it);
launch/slurm/train.sbatch is an example. Process 0 writes the files.
"""

from __future__ import annotations

import sys

from absl import flags

from launch._cli import Command, check_resume_changes, check_settings, define_distributed_flags, define_run_flags

CLI = Command("launch.train", __doc__, config=True, config_required=True)
RESUME, OVERWRITE, ALLOW_CHANGE = define_run_flags(CLI)
START = define_distributed_flags(CLI)
SKIP_PREFLIGHT = flags.DEFINE_bool("skip-preflight", False, "start without the preflight checks (launch.preflight)",
                                   flag_values=CLI.flags)


def preflight_or_exit(config) -> None:
    """The preflight checks; a failure prints its lines and exits 2 before anything loads."""
    import logging

    from dart_jax.preflight import preflight
    report = preflight(config)
    for check in report.checks:
        if check.failed:
            print(f"launch.train: {check.line()}", file=sys.stderr)
        else:
            logging.getLogger("launch.train").info("preflight %s", check.line())
    if not report.ok:
        print("launch.train: preflight failed; fix what it names (or start with --skip-preflight)", file=sys.stderr)
        raise SystemExit(2)


def main(argv: list[str] | None = None) -> int:
    CLI.parse(argv)
    START()
    check_settings(CLI)  # every setting's range and rule, in one line, before anything loads or is written
    check_resume_changes(CLI, RESUME, ALLOW_CHANGE)  # changed settings of a resumed run, before anything loads
    if not SKIP_PREFLIGHT.value:
        preflight_or_exit(CLI.config.value)
    from dart_jax.rl.trainer import Trainer, summary
    from dart_jax.run.run_dir import RunDirError
    try:
        print(summary(Trainer(CLI.config.value).run(resume=RESUME.value, overwrite=OVERWRITE.value,
                                                    allow_change=ALLOW_CHANGE.value)))
    except RunDirError as e:
        raise SystemExit(f"launch.train: {e}") from None
    return 0


if __name__ == "__main__":
    CLI.run(main)
