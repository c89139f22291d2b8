"""Supervised warm start on protocol-following trajectories (demonstrations built from real data and
tools, or a saved run's correct trajectories); writes a warm-start directory that a GRPO run merges
into its base with `--config.warm_start=DIR` (dart_jax/sft/trainer.py).

    python -m launch.sft --config=configs/sft_quickstart.py
    python -m launch.sft --config=configs/sft_quickstart.py --config.sft.epochs=2 --overwrite
    python -m launch.sft --config=configs/sft_quickstart.py --config.sft.epochs=2 --resume

--resume runs the settings that wrote the run: one that differs from its run_config.json (a seed, a
learning rate, ...) is refused, named old → new, unless --allow-change names it (then recorded in
provenance.jsonl); the run's length, output paths, cadences and layout may change freely.
"""

from __future__ import annotations

from launch._cli import Command, check_resume_changes, check_settings, define_run_flags

CLI = Command("launch.sft", __doc__, config=True, config_required=True)
RESUME, OVERWRITE, ALLOW_CHANGE = define_run_flags(CLI)


def main(argv: list[str] | None = None) -> int:
    CLI.parse(argv)
    check_settings(CLI)  # every setting's range and rule, in one line, before anything loads or is written
    check_resume_changes(CLI, RESUME, ALLOW_CHANGE)  # changed settings of a resumed run, before anything loads
    from dart_jax.sft.trainer import SFTTrainer, sft_summary
    print(sft_summary(SFTTrainer(CLI.config.value).run(resume=RESUME.value, overwrite=OVERWRITE.value,
                                                       allow_change=ALLOW_CHANGE.value)))
    return 0


if __name__ == "__main__":
    CLI.run(main)
