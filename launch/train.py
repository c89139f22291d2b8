"""python -m launch.train --config=configs/quickstart.py [--config.train.steps=8] [--resume | --overwrite]

GRPO training (DART, LoRA, full-parameter, CEA variants) as the config says; see configs/."""

from __future__ import annotations

from launch import _job


def main(argv) -> None:
    del argv
    config = _job.config_or_exit()
    from dart_jax.rl.trainer import Trainer, summary
    from dart_jax.rl.run_dir import RunDirError
    try:
        print(summary(Trainer(config).run(resume=_job.RESUME.value, overwrite=_job.OVERWRITE.value)))
    except RunDirError as e:
        raise SystemExit(f"launch.train: {e}") from None


if __name__ == "__main__":
    _job.run(main)
