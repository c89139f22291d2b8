"""launch's persistent compilation cache (dart_jax/run/compile_cache.py): where it goes and when it is left
off, by hand; and a `python -m launch.X`-style command (launch._cli.Command.run) writing a compiled program
into it and loading it in the next process instead of compiling again."""

import os
import subprocess
import sys
import textwrap

import pytest

from dart_jax.errors import UserError
from dart_jax.run import compile_cache

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def test_where_the_cache_goes_and_when_it_is_off(tmp_path):
    tag = compile_cache.host_tag()
    assert tag.startswith(os.uname().machine + "-") and tag == compile_cache.host_tag()
    home = os.path.join(os.path.expanduser("~"), ".cache", "dart_jax", "xla", tag)
    assert compile_cache.cache_dir({}) == home
    assert compile_cache.cache_dir({"DART_JAX_CACHE": "/data/c"}) == os.path.join("/data/c", "xla", tag)
    assert compile_cache.cache_dir({"DART_JAX_XLA_CACHE": "/x", "DART_JAX_CACHE": "/data/c"}) == os.path.join("/x", tag)
    for off in ("off", "0", "False", "none"):
        assert compile_cache.cache_dir({"DART_JAX_XLA_CACHE": off}) is None
    # JAX's own setting wins: left alone
    assert compile_cache.cache_dir({"JAX_COMPILATION_CACHE_DIR": "/j", "DART_JAX_XLA_CACHE": "/x"}) is None
    with pytest.raises(UserError, match="DART_JAX_XLA_CACHE_GIB='lots'"):
        compile_cache.enable({"DART_JAX_XLA_CACHE": str(tmp_path), "DART_JAX_XLA_CACHE_GIB": "lots"})
    # jax imported with a cache named (this test session's): left as it is
    import jax
    env = {"DART_JAX_XLA_CACHE": str(tmp_path / "x")}
    assert jax.config.jax_compilation_cache_dir and compile_cache.enable(env) is None
    assert "JAX_COMPILATION_CACHE_DIR" not in env and not (tmp_path / "x").exists()
    # a folder that cannot be made: off, with a warning, and the command goes on
    (tmp_path / "file").write_text("")
    jax_dir = jax.config.jax_compilation_cache_dir
    try:
        jax.config.update("jax_compilation_cache_dir", None)
        assert compile_cache.enable({"DART_JAX_XLA_CACHE": str(tmp_path / "file" / "sub")}) is None
        assert jax.config.jax_compilation_cache_dir is None
    finally:
        jax.config.update("jax_compilation_cache_dir", jax_dir)


COMMAND = textwrap.dedent("""
    import sys
    from launch._cli import Command

    CLI = Command("launch.cache_probe", "A command that compiles one program (jax imported in main, as\
    launch.sweep does after setting XLA_FLAGS: the cache reaches it through the environment).")

    def main(argv=None):
        CLI.parse(argv)
        assert "jax" not in sys.modules
        import jax, jax.numpy as jnp
        jax.config.update("jax_persistent_cache_min_compile_time_secs", 0)  # the probe's program is tiny
        events = []
        jax.monitoring.register_event_duration_secs_listener(lambda e, d, **_: events.append(e))
        f = jax.jit(lambda x: jnp.tanh(x @ x.T).sum() * 3.0)
        f(jnp.ones((64, 64))).block_until_ready()
        print(jax.config.jax_compilation_cache_dir)
        print("hit" if "/jax/compilation_cache/cache_retrieval_time_sec" in events else "miss")
        return 0

    if __name__ == "__main__":
        CLI.run(main)
    """)


def test_a_command_stores_its_program_and_the_next_process_loads_it(tmp_path):
    probe = tmp_path / "probe.py"
    probe.write_text(COMMAND)
    env = {k: v for k, v in os.environ.items() if k != "JAX_COMPILATION_CACHE_DIR"}
    env.update(DART_JAX_XLA_CACHE=str(tmp_path / "xla"), PYTHONPATH=REPO, JAX_PLATFORMS="cpu")
    env.pop("XLA_FLAGS", None)

    def run():
        out = subprocess.run([sys.executable, str(probe)], env=env, capture_output=True, text=True, timeout=300)
        assert out.returncode == 0, out.stderr[-2000:]
        return out.stdout.split()

    where, first = run()
    assert where == str(tmp_path / "xla" / compile_cache.host_tag()) and first == "miss"
    assert len(os.listdir(where)) >= 1  # the compiled program, stored
    assert run() == [where, "hit"]  # the next process loads it
    env["DART_JAX_XLA_CACHE"] = "off"
    assert run() == ["None", "miss"]  # off: nothing stored or loaded
