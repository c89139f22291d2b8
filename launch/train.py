"""python -m launch.train --config=configs/quickstart.py [--config.train.steps=8] [--resume]

GRPO training (DART, LoRA, full-parameter, CEA variants) as the config says; see configs/."""

from __future__ import annotations

from launch import _job


def main(argv) -> None:
    del argv
    config = _job.config_or_exit()
    from dart_jax.rl.trainer import Trainer, summary
    print(summary(Trainer(config).run(resume=_job.RESUME.value)))


if __name__ == "__main__":
    _job.run(main)
