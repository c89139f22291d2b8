"""The serving tests' fixture (tests/serve_setup.py)."""

from serve_setup import serve_setup  # noqa: F401
