"""What `launch.train` and `launch.sft` share: the --config / --resume / --overwrite flags and quiet logging."""

from __future__ import annotations

from absl import app, flags
from ml_collections import config_flags

from launch._log import setup_logging

CONFIG = config_flags.DEFINE_config_file("config", None, "an ml_collections config file (configs/*.py)")
RESUME = flags.DEFINE_bool("resume", False, "continue from the newest usable checkpoint in output.dir (fails, "
                                            "saying why, when none can be restored)")
OVERWRITE = flags.DEFINE_bool("overwrite", False, "start afresh in an output.dir that already holds a run, "
                                                  "removing its checkpoints and records")


def config_or_exit():
    """The parsed config, with logging set up."""
    setup_logging()
    if CONFIG.value is None:
        raise app.UsageError("--config=configs/NAME.py is required")
    return CONFIG.value


def run(main) -> None:
    flags.mark_flag_as_required("config")
    app.run(main)
