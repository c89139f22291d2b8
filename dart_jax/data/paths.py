"""Where the repository and its shipped data live: paths in configs resolve from any working
directory (`data/...` is the repository's data folder, not the caller's); and where dart_jax keeps
what it derives from its inputs (indexes, compiled programs, converted tokenizers): `cache_root`."""

from __future__ import annotations

import os

REPO = os.path.normpath(os.path.join(os.path.dirname(__file__), "..", ".."))
DATA = os.path.join(REPO, "data")


def repo_path(path: str) -> str:
    """A path as given when it exists (or is absolute), else relative to the repository root: shipped
    files (data/...) resolve from any working directory."""
    if not path or os.path.isabs(path) or os.path.exists(path):
        return path
    return os.path.join(REPO, path)


def cache_root(environ=None) -> str:
    """$DART_JAX_CACHE, default ~/.cache/dart_jax: what dart_jax derives from its inputs and keeps between runs."""
    env = os.environ if environ is None else environ
    return env.get("DART_JAX_CACHE") or os.path.join(os.path.expanduser("~"), ".cache", "dart_jax")


def file_key(path: str) -> str:
    """A file's identity for what is derived from it and kept (`cache_root`): its real path, size, modification
    and change times and inode (a copy made with its modification time kept still differs in the last two)."""
    real = os.path.realpath(path)
    st = os.stat(real)
    return f"{real}|{st.st_size}|{st.st_mtime_ns}|{st.st_ctime_ns}|{st.st_ino}"
