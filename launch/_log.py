"""Quiet logging for the launch scripts: INFO for dart_jax and launch, WARNING for the libraries
around them (faiss's loader, jax's backend probing, absl, orbax), and a note that repeats word for
word (a sharding note on every tree placed, a data file's dropped rows on each read) shown once.
`--verbose` shows everything: every library at INFO, every repeat."""

from __future__ import annotations

import logging

OURS = ("dart_jax", "launch")


class Once(logging.Filter):
    """Pass a dart_jax / launch record the first time its text appears; drop its repeats."""

    def __init__(self):
        super().__init__()
        self.seen: set[tuple[str, int, str]] = set()

    def filter(self, record: logging.LogRecord) -> bool:
        if not record.name.startswith(OURS) or record.levelno >= logging.WARNING:
            return True
        key = (record.name, record.levelno, record.getMessage())
        if key in self.seen:
            return False
        self.seen.add(key)
        return True


class BarSafeHandler(logging.StreamHandler):
    """Writes each line through tqdm.write: a log line printed while a progress bar is on screen
    (a compile during the first GRPO step) lands above the bar instead of in the middle of it."""

    def emit(self, record: logging.LogRecord) -> None:
        try:
            from tqdm import tqdm
            tqdm.write(self.format(record), file=self.stream)
        except Exception:  # noqa: BLE001 — logging's own policy for a failed write
            self.handleError(record)


def setup_logging(verbose: bool = False) -> None:
    # force: absl installs its own root handler at import, which (outside absl.app.run) prints nothing
    logging.basicConfig(level=logging.INFO if verbose else logging.WARNING, handlers=[BarSafeHandler()],
                        format="%(asctime)s %(levelname)s %(name)s: %(message)s", force=True)
    for name in OURS:
        logging.getLogger(name).setLevel(logging.INFO)
    for name in ("absl", "jax", "orbax", "faiss"):
        logging.getLogger(name).setLevel(logging.NOTSET if verbose else logging.WARNING)
    if not verbose:
        for handler in logging.getLogger().handlers:
            handler.addFilter(Once())
