"""GRPO training — DART, LoRA, full-parameter and the CEA variants — as the config says (configs/).

    python -m launch.train --config=configs/quickstart.py
    python -m launch.train --config=configs/quickstart.py --resume --config.train.steps=32
    python -m launch.train --config=configs/paper_qa.py:dart,qwen2.5-3b-base --config.model.path=DIR \\
        --config.data.train[0].path=train.parquet --config.retriever.url=http://127.0.0.1:8000/retrieve

A new run refuses an output.dir that holds a run (--resume continues it, --overwrite replaces it).

Multi-process (multi-host): the same command on every process, with --coordinator=HOST:PORT
--num-processes=N --process-id=I, or with --distributed under SLURM / Open MPI / a Cloud TPU pod
(jax's cluster detection; a SLURM or Open MPI job step with several tasks is detected without it);
launch/slurm/train.sbatch is an example. Process 0 writes the files.
"""

from __future__ import annotations

import sys

from launch._cli import Command, define_distributed_flags, define_run_flags

CLI = Command("launch.train", __doc__, config=True, config_required=True)
RESUME, OVERWRITE = define_run_flags(CLI)
START = define_distributed_flags(CLI)


def main(argv: list[str] | None = None) -> int:
    CLI.parse(argv)
    START()
    from dart_jax.rl.trainer import Trainer, summary
    from dart_jax.run.run_dir import RunDirError
    try:
        print(summary(Trainer(CLI.config.value).run(resume=RESUME.value, overwrite=OVERWRITE.value)))
    except RunDirError as e:
        raise SystemExit(f"launch.train: {e}") from None
    return 0


if __name__ == "__main__":
    sys.exit(main())
