"""python -m launch.train --config=configs/quickstart.py [--config.train.steps=8] [--resume]

GRPO training (DART, LoRA, full-parameter, CEA variants) as the config says; see configs/."""

from __future__ import annotations

import logging

from absl import app, flags
from ml_collections import config_flags

_CONFIG = config_flags.DEFINE_config_file("config", None, "an ml_collections config file (configs/*.py)")
_RESUME = flags.DEFINE_bool("resume", False, "continue from the newest usable checkpoint in output.dir")


def main(argv) -> None:
    del argv
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    for noisy in ("absl", "jax", "orbax", "jax._src"):
        logging.getLogger(noisy).setLevel(logging.WARNING)
    from dart_jax.rl.trainer import Trainer, summary
    config = _CONFIG.value
    if config is None:
        raise app.UsageError("--config=configs/NAME.py is required")
    result = Trainer(config).run(resume=_RESUME.value)
    print(summary(result))


if __name__ == "__main__":
    flags.mark_flag_as_required("config")
    app.run(main)
