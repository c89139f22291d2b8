"""Quiet logging for the launch scripts: INFO for dart_jax, WARNING for the libraries around it."""

from __future__ import annotations

import logging


def setup_logging() -> None:
    # force: absl installs its own root handler at import, which (outside absl.app.run) prints nothing
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s", force=True)
    for noisy in ("absl", "jax", "orbax", "jax._src"):
        logging.getLogger(noisy).setLevel(logging.WARNING)
