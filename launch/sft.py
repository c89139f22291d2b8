"""python -m launch.sft --config=configs/sft_quickstart.py [--config.sft.epochs=2] [--resume | --overwrite]

Supervised warm start on protocol-following trajectories (demonstrations built from real data and
tools, or a saved run's correct trajectories); writes a warm-start directory that a GRPO run merges
into its base with `--config.warm_start=DIR`. See dart_jax/sft/trainer.py."""

from __future__ import annotations

from launch import _job


def main(argv) -> None:
    del argv
    config = _job.config_or_exit()
    from dart_jax.sft.trainer import SFTTrainer, sft_summary
    from dart_jax.rl.run_dir import RunDirError
    try:
        print(sft_summary(SFTTrainer(config).run(resume=_job.RESUME.value, overwrite=_job.OVERWRITE.value)))
    except RunDirError as e:
        raise SystemExit(f"launch.sft: {e}") from None


if __name__ == "__main__":
    _job.run(main)
