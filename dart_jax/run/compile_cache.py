"""JAX's persistent compilation cache for every `python -m launch.X`, on by default.

A run on this project's CPUs spends minutes compiling (the lab's first GRPO step: ~2 of its ~4 minutes;
an evaluation compiles its decode and append programs again) and a study compiles the same programs once
per run: `launch.methods` builds a Trainer per method × seed, whose jitted closures are new functions,
so JAX's in-memory cache misses where the persistent cache (keyed by the program, not the closure) hits.

    where      $JAX_COMPILATION_CACHE_DIR if set (JAX's own setting: left alone), else $DART_JAX_XLA_CACHE,
               else $DART_JAX_CACHE/xla (default ~/.cache/dart_jax/xla), in a folder per host CPU
               (XLA:CPU compiles for the host's instruction set: a program compiled on an AVX-512 node
               must not be loaded on an AVX2 one sharing the home directory)
    off        DART_JAX_XLA_CACHE=off
    size       at most DART_JAX_XLA_CACHE_GIB GiB (default 4), least recently used entries evicted (JAX's
               jax_compilation_cache_max_size); programs that compile in under a second are not stored
               (JAX's default jax_persistent_cache_min_compile_time_secs)

Set by launch's Command.run only; the test suite names its own cache in JAX_COMPILATION_CACHE_DIR
(tests/conftest.py), which every command it starts then keeps.
"""

from __future__ import annotations

import hashlib
import logging
import os
import platform
import sys

from dart_jax.data.paths import cache_root
from dart_jax.errors import UserError

log = logging.getLogger(__name__)
OFF = ("off", "0", "false", "no", "none")


def host_tag() -> str:
    """A short id of this host's CPU (architecture, model and feature flags): the cache's subfolder."""
    parts = [platform.machine()]
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                key = line.split(":", 1)[0].strip()
                if key in ("model name", "flags", "Features", "CPU part"):
                    parts.append(line.strip())
                if line.strip() == "":  # the first processor's block is enough
                    break
    except OSError:
        parts.append(platform.processor())
    digest = hashlib.sha1("\n".join(parts).encode()).hexdigest()[:10]
    return f"{platform.machine()}-{digest}"


def cache_dir(environ=None) -> str | None:
    """The folder launch's commands cache compiled programs in, or None (off, or JAX's own setting)."""
    env = os.environ if environ is None else environ
    if env.get("JAX_COMPILATION_CACHE_DIR"):
        return None
    chosen = env.get("DART_JAX_XLA_CACHE", "").strip()
    if chosen.lower() in OFF:
        return None
    root = chosen or os.path.join(cache_root(env), "xla")
    return os.path.join(root, host_tag())


def enable(environ=None) -> str | None:
    """Turn the cache on for this process and the processes it starts (before its first compile); -> the
    folder, or None if left off. Set through the environment JAX reads when it is imported, so a command
    that sets XLA_FLAGS before importing jax (launch.sweep's forced host devices) still can; where jax is
    already imported, through its config, unless that already names a cache (a test session's). A folder
    that cannot be made leaves the cache off with a warning: it saves time, nothing depends on it."""
    env = os.environ if environ is None else environ
    path = cache_dir(env)
    if path is None:
        return None
    try:
        size = int(float(env.get("DART_JAX_XLA_CACHE_GIB", "4")) * 2 ** 30)
    except ValueError:
        raise UserError(f"DART_JAX_XLA_CACHE_GIB={env['DART_JAX_XLA_CACHE_GIB']!r}: expected a number of GiB") from None
    jax = sys.modules.get("jax")
    if jax is not None and jax.config.jax_compilation_cache_dir:
        return None
    try:
        os.makedirs(path, exist_ok=True)
    except OSError as e:
        log.warning("compiled programs are not kept across runs: cannot make %s (%s); DART_JAX_XLA_CACHE=DIR "
                    "names another folder", path, e)
        return None
    env["JAX_COMPILATION_CACHE_DIR"] = path
    env["JAX_COMPILATION_CACHE_MAX_SIZE"] = str(size)
    if jax is not None:
        jax.config.update("jax_compilation_cache_dir", path)
        jax.config.update("jax_compilation_cache_max_size", size)
    return path
