"""The one exception a user mistake raises anywhere in dart_jax, so that every `launch.*` command can
tell "what you asked for is wrong" (one line, exit status 2; launch/_cli.py) from a bug (traceback).
A module below every package: any layer may raise it."""

from __future__ import annotations


class UserError(ValueError):
    """A mistake in what the user asked for: reported as one line."""
