"""One convention for every `python -m launch.X`: absl flags on the command's own FlagValues
(`--flag=value`, `--config=FILE[:ARG]` with `--config.field=value` overrides where a config
exists, multi-word flags with dashes), `--help` printing the command's docstring (purpose and an
example) and its flags, quiet logging, and every user mistake reported as one line
`launch.X: what is wrong; what to do` on stderr with exit status 2 (`--verbose`: with its traceback
and the libraries' log lines).

    CLI = Command("launch.X", __doc__, config=True)
    N = flags.DEFINE_integer("n", 4, "trajectories", flag_values=CLI.flags)

    def main(argv=None) -> int:
        args = CLI.parse(argv)          # positional arguments (e.g. a subcommand)
        ...

    if __name__ == "__main__":
        CLI.run(main)                   # user mistakes -> one line, exit 2; a bug keeps its traceback

Each command owns its FlagValues, so commands can share flag names (--model, --out, --json) and
still be imported together (tests call several `main(argv)` in one process).

What counts as a user mistake (`is_user_mistake`): dart_jax.errors.UserError, a missing / misplaced
file (FileNotFoundError, NotADirectoryError, IsADirectoryError, PermissionError), a port already in
use, the run-directory / data / checkpoint refusals (RunDirError, DataError, CheckpointMismatch, …)
and `raise SystemExit("message")`. Anything else is a bug and keeps Python's traceback.
"""

from __future__ import annotations

import difflib
import errno
import importlib.util
import os
import re
import sys
import traceback
from collections.abc import Callable
from typing import Any, NoReturn

from absl import flags
from ml_collections import config_flags

from launch._log import setup_logging

HELP = ("-h", "--help", "-help", "--helpfull")
# Exceptions raised for what the user asked for (module.qualname, so that none of them is imported
# here: a command's --help stays instant, and a class can only be raised once its module is loaded).
MISTAKES = frozenset({
    "dart_jax.errors.UserError",
    "dart_jax.run.run_dir.RunDirError",
    "dart_jax.data.readers.DataError",
    "dart_jax.checkpoints.loader.CheckpointMismatch",
    "dart_jax.checkpoints.authors_io.AuthorsLayoutError",
    "dart_jax.data.sql_hardness.HardnessError",
    "builtins.FileNotFoundError", "builtins.NotADirectoryError", "builtins.IsADirectoryError",
    "builtins.PermissionError",
})


def is_user_mistake(e: BaseException) -> bool:
    """A mistake in what the user asked for (reported as one line), not a bug (a traceback)."""
    if isinstance(e, OSError) and e.errno == errno.EADDRINUSE:
        return True
    return any(f"{c.__module__}.{c.__qualname__}" in MISTAKES for c in type(e).__mro__)


def describe(e: BaseException) -> str:
    """The one line that reports mistake `e` (without the command's name)."""
    if isinstance(e, OSError) and e.errno == errno.EADDRINUSE:
        return f"{e.strerror or e}; the port is taken: stop what listens on it, or pick another --port"
    if isinstance(e, OSError) and e.filename is not None and e.strerror and str(e).startswith("[Errno"):
        return f"{e.filename}: {e.strerror.lower()}; check the path"
    text = e.args[0] if isinstance(e, KeyError) and e.args and isinstance(e.args[0], str) else str(e)
    return " ".join(text.split()) or type(e).__name__


def _verbose(argv: list[str]) -> bool:
    """--verbose as the command line says it (read before parsing: a failed parse must know it too)."""
    on = False
    for a in argv:
        if a in ("--verbose", "-verbose", "--verbose=true", "--verbose=1", "--verbose=True"):
            on = True
        elif a in ("--noverbose", "--verbose=false", "--verbose=0", "--verbose=False"):
            on = False
    return on


class Command:
    def __init__(self, name: str, doc: str, config: bool = False, config_required: bool = False):
        self.prog, self.doc = name, doc.strip()
        self.flags = flags.FlagValues()
        self.config_required = config_required
        self.verbose = False
        flags.DEFINE_bool("verbose", False, "show the libraries' log lines and, with a reported mistake, its "
                          "traceback", flag_values=self.flags)
        self.config = self._define_config([]) if config else None

    def _define_config(self, argv: list[str]):
        """(Re)define --config: ml_collections registers the `--config.x=y` override flags from the
        argv it is given at definition time, so each parse defines it again for its own argv."""
        for name in [n for n in list(self.flags) if n == "config" or n.startswith("config.")]:
            delattr(self.flags, name)
        return config_flags.DEFINE_config_file(
            "config", None, "an ml_collections config file, configs/NAME.py[:ARG]; override any field with "
            "--config.section.field=value", flag_values=self.flags, sys_argv=[self.prog] + list(argv))

    def usage(self) -> str:
        return f"{self.doc}\n\nflags:\n{self.flags.get_help()}"

    def fail(self, message: str, cause: BaseException | None = None) -> NoReturn:
        """Report a mistake as `launch.X: message` (with --verbose, `cause`'s traceback first), exit 2."""
        if self.verbose and cause is not None:
            traceback.print_exception(cause)
        print(f"{self.prog}: {message}", file=sys.stderr)
        raise SystemExit(2)

    def parse(self, argv: list[str] | None = None) -> list[str]:
        """Parse `argv` (default sys.argv[1:]) -> positional arguments; --help prints and exits 0; a
        bad flag, config file or override is reported in one line (exit 2) before anything runs."""
        argv = list(sys.argv[1:] if argv is None else argv)
        self.verbose = _verbose(argv)
        if any(a in HELP for a in argv):
            print(self.usage())
            raise SystemExit(0)
        if self.flags.is_parsed():
            self.flags.unparse_flags()  # a second parse in one process starts from the defaults again
        if self.config is not None:
            self._check_config_args(argv)
            self.config = self._define_config(argv)
        try:
            rest = self.flags([self.prog] + argv)
        except flags.Error as e:
            self.fail(self._flag_error(e, argv), e)
        except (KeyError, AttributeError, IndexError) as e:  # ml_collections: an override path the config lacks
            problem = _override_problem(config_arg(argv), argv)
            if problem is None:
                raise
            self.fail(problem, e)
        if self.config_required and self.config.value is None:
            self.fail("--config=configs/NAME.py is required; --help shows an example")
        if self.config is not None and self.config.value is not None:
            problem = _repeated_tuple(self.config.value, argv)
            if problem:
                self.fail(problem)
        setup_logging(self.verbose)
        return rest[1:]

    def _check_config_args(self, argv: list[str]) -> None:
        """One --config, given before its overrides, naming a file that exists."""
        specs = [a.split("=", 1)[1] for a in argv if re.match(r"-{1,2}config=", a)]
        specs += [argv[i + 1] for i, a in enumerate(argv[:-1]) if a in ("--config", "-config")]
        overrides = _overrides(argv)
        if len(specs) > 1:
            self.fail(f"--config given {len(specs)} times ({', '.join(specs)}); give one config file and change "
                      "its fields with --config.section.field=value")
        if not specs and overrides:
            path, value = overrides[0]
            self.fail(f"--config.{path}={value} changes a config, but no --config=FILE names one; e.g. "
                      f"--config=configs/quickstart.py --config.{path}={value}")
        if specs:
            self._check_config_file(specs[0])

    def _check_config_file(self, spec: str) -> None:
        path = spec.split(":", 1)[0]
        if os.path.isfile(path):
            return
        folder = os.path.dirname(path) or "."
        have = sorted(n for n in os.listdir(folder) if n.endswith(".py")) if os.path.isdir(folder) else []
        close = difflib.get_close_matches(os.path.basename(path), have, n=1, cutoff=0.8)
        hint = (f"did you mean {os.path.join(os.path.dirname(path), close[0])}?" if close else
                "the configs are configs/*.py (e.g. --config=configs/quickstart.py)")
        self.fail(f"--config={spec}: no such config file; {hint}")

    def _flag_error(self, e: flags.Error, argv: list[str]) -> str:
        """absl / ml_collections' error -> one line naming the flag, what is wrong and what to do."""
        text = str(e)
        if "Error whilst parsing config file" in text:  # get_config raised: its last line says why
            last = [line for line in text.splitlines() if line.strip()][-1].strip()
            return f"--config={config_arg(argv)}: {last}; the config file's docstring lists its arguments"
        m = re.match(r"flag --config\.([^=]+)=(.*?): (.*)", text, re.S)
        config = _load_config(config_arg(argv)) if m else None
        if config is not None:
            path, value = m.group(1), m.group(2)
            try:
                current = _walk(config, path)
            except LookupError as missing:
                return f"--config.{path}={value}: {missing}"
            if hasattr(current, "keys"):
                first = next(iter(current.keys()), "field")
                return (f"--config.{path}={value}: {path} is a section; set its fields one by one, e.g. "
                        f"--config.{path}.{first}={_example(current[first]) if first in current else '...'}")
            return (f"--config.{path}={value}: {path} takes {_type_words(current)} (the config has "
                    f"{current!r}); e.g. --config.{path}={_example(current)}")
        first = text.splitlines()[0] if text else type(e).__name__
        return f"{first.rstrip('.')}; --help lists the flags"

    def value(self, name: str):
        return self.flags[name].value

    def run(self, main: Callable[[list[str] | None], int], argv: list[str] | None = None) -> NoReturn:
        """`python -m launch.X`: run `main`, report a user mistake as one line with exit status 2
        (with its traceback under --verbose), let a bug raise with its traceback."""
        args = list(sys.argv[1:] if argv is None else argv)
        self.verbose = _verbose(args)
        try:
            if not any(a in HELP for a in args):
                from dart_jax.run import compile_cache
                compile_cache.enable()  # compiled programs kept across runs (dart_jax/run/compile_cache.py)
            code = main(argv)
        except SystemExit as e:
            if not isinstance(e.code, str):
                raise
            message = e.code.strip()
            if message.startswith(self.prog + ":"):
                message = message[len(self.prog) + 1:].strip()
            self.fail(message, e)
        except KeyboardInterrupt as e:  # Ctrl-C: a line, not a page of the stack it stopped in
            if self.verbose:
                traceback.print_exception(e)
            print(f"{self.prog}: interrupted", file=sys.stderr)
            raise SystemExit(130) from None
        except Exception as e:
            if not is_user_mistake(e):
                raise
            self.fail(describe(e), e)
        raise SystemExit(code)


def config_arg(argv: list[str]) -> str | None:
    """The value of --config in `argv` (the last one), or None."""
    value = None
    for i, a in enumerate(argv):
        if a.startswith("--config=") or a.startswith("-config="):
            value = a.split("=", 1)[1]
        elif a in ("--config", "-config") and i + 1 < len(argv):
            value = argv[i + 1]
    return value


def load_config_file(spec: str):
    """The config `spec` (FILE[:ARG]) names, loaded as ml_collections does (its get_config(ARG))."""
    path, *arg = spec.split(":", 1)
    if not os.path.isfile(path):
        raise FileNotFoundError(f"config file {path} not found")
    module_spec = importlib.util.spec_from_file_location("_launch_config_check", path)
    module = importlib.util.module_from_spec(module_spec)
    module_spec.loader.exec_module(module)
    return module.get_config(*arg)


def _load_config(spec: str | None):
    """The config `spec` (FILE[:ARG]) names, loaded as ml_collections does; None if it cannot be."""
    if not spec:
        return None
    try:
        return load_config_file(spec)
    except Exception:  # noqa: BLE001 — the real parse reports the config's own failure
        return None


_PART = re.compile(r"([^\[\]]+)((?:\[\d+\])*)$")


def _walk(config, path: str) -> Any:
    """The value at dotted `path` (with [i] indices, as ml_collections' overrides write them);
    LookupError naming the first part that is not there, with the closest field names."""
    node, done = config, []
    for part in path.split("."):
        m = _PART.match(part)
        name, indices = (m.group(1), [int(i) for i in re.findall(r"\d+", m.group(2))]) if m else (part, [])
        keys = list(node.keys()) if hasattr(node, "keys") else []
        if name not in keys:
            full = ".".join(done + [name])
            close = difflib.get_close_matches(name, keys, n=1)
            prefix = ".".join(done)
            where = f"{prefix} has " if prefix else "the config has "
            hint = (f"did you mean {'.'.join(done + [close[0]])}?" if close else
                    f"{where}{', '.join(sorted(keys)) or 'no fields'}")
            raise LookupError(f"no field {full}; {hint}")
        node = node[name]
        done.append(name)
        for i in indices:
            if not isinstance(node, (list, tuple)) or i >= len(node):
                n = len(node) if isinstance(node, (list, tuple)) else 0
                raise LookupError(f"{'.'.join(done)} has {n} {'entry' if n == 1 else 'entries'}, no [{i}]; "
                                  f"indices run from 0 to {n - 1}" if n else f"{'.'.join(done)} is empty, no [{i}]")
            node = node[i]
            done[-1] += f"[{i}]"
    return node


def _overrides(argv: list[str]) -> list[tuple[str, str]]:
    """(path, value) of each --config.PATH=VALUE in argv, in order; `--config.PATH VALUE` (absl's
    spaced form) too, its value the next argument."""
    out = []
    for i, a in enumerate(argv):
        m = re.match(r"-{1,2}(no)?config\.([^=]+)(?:=(.*))?$", a)
        if not m:
            continue
        value = m.group(3)
        if value is None and not m.group(1) and i + 1 < len(argv) and _is_value(argv[i + 1]):
            value = argv[i + 1]
        out.append((m.group(2), value if value is not None else ""))
    return out


def _is_value(arg: str) -> bool:
    """Whether `arg`, after a `--config.PATH` with no `=`, is its value rather than the next flag."""
    return not arg.startswith("-") or re.fullmatch(r"-[\d.,()\[\] e+-]*", arg) is not None


def _override_problem(spec: str | None, argv: list[str]) -> str | None:
    """The first --config.PATH=VALUE whose PATH the config lacks, as one line with a suggestion."""
    config = _load_config(spec)
    if config is None:
        return None
    for path, value in _overrides(argv):
        try:
            _walk(config, path)
        except LookupError as e:
            return f"--config.{path}={value}: {e}"
    return None


def _repeated_tuple(config, argv: list[str]) -> str | None:
    """A tuple field given whole more than once: ml_collections would concatenate the tuples
    (`--config.mesh.shape=1,2,1 --config.mesh.shape=2,1,1` -> (1, 2, 1, 2, 1, 1)), never what was meant.
    Repeating single items (`--config.x=1 --config.x=2` -> (1, 2)) stays the way to build a tuple."""
    seen: dict[str, list[str]] = {}
    for path, value in _overrides(argv):
        seen.setdefault(path, []).append(value)
    for path, values in seen.items():
        if len(values) < 2 or not any("," in v or "(" in v for v in values):
            continue
        try:
            is_tuple = isinstance(_walk(config, path), tuple)
        except LookupError:
            continue
        if is_tuple:
            return (f"--config.{path} given {len(values)} times ({' and '.join(values)}): the tuples would be "
                    f"joined into one; give the whole tuple once, e.g. --config.{path}={values[-1]}")
    return None


def check_settings(cmd: Command) -> None:
    """The run's settings parsed as the trainers parse them (run.spec.run_spec: every field's range and
    the rules between fields) right after the command line, so a bad value is one line (exit 2) before
    any model loads or any file of output.dir is written."""
    import jax

    from dart_jax.run.spec import run_spec
    try:
        run_spec(cmd.config.value, jax.process_count())
    except ValueError as e:
        cmd.fail(describe(e), e)


def check_port(host: str, port: int, flag: str = "--port") -> None:
    """Refuse, before anything loads, a port that cannot be bound: out of range, or in use (an OSError
    with EADDRINUSE naming host:port, which `describe` turns into one line). The probe binds as the
    servers do (SO_REUSEADDR: a port in TIME_WAIT is free) and releases the port at once."""
    import socket
    if not 0 <= port <= 65535:
        raise SystemExit(f"{flag}={port}: a port is 0 to 65535 (0: any free one)")
    if port == 0:
        return
    try:
        infos = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)
    except socket.gaierror as e:
        raise SystemExit(f"--host={host}: {e.strerror or e}; give an address such as 127.0.0.1") from None
    family, _, _, _, address = infos[0]
    with socket.socket(family, socket.SOCK_STREAM) as probe:
        probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            probe.bind(address)
        except OSError as e:
            if e.errno == errno.EADDRINUSE:
                raise OSError(errno.EADDRINUSE, f"address already in use: {host}:{port}") from None
            raise


def _type_words(value: Any) -> str:
    if value is None:
        return "a value"
    if isinstance(value, bool):
        return "true or false"
    if isinstance(value, int):
        return "an integer"
    if isinstance(value, float):
        return "a number"
    if isinstance(value, str):
        return "a string"
    if isinstance(value, tuple):
        return "a tuple"
    return f"a {type(value).__name__}"


def _example(value: Any) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, tuple):
        return ",".join(str(v) for v in value) if value else "1,2,1"
    return str(value)


def define_distributed_flags(cmd: Command):
    """--coordinator / --num-processes / --process-id: a multi-process run (parallel.distributed);
    without them jax's cluster detection (SLURM, Open MPI, TPU pods) decides. -> start(), to call
    after parsing and before anything touches jax's backend."""
    coord = flags.DEFINE_string("coordinator", "", "multi-process: HOST:PORT of process 0's coordinator service",
                                flag_values=cmd.flags)
    nproc = flags.DEFINE_integer("num-processes", 0, "multi-process: how many processes take part",
                                 flag_values=cmd.flags)
    pid = flags.DEFINE_integer("process-id", -1, "multi-process: this process's index in [0, num-processes)",
                               flag_values=cmd.flags)
    auto = flags.DEFINE_bool("distributed", False, "multi-process: let jax detect the cluster (SLURM, Open MPI, "
                                                   "Cloud TPU pods) and start its distributed runtime",
                             flag_values=cmd.flags)

    def start() -> bool:
        from dart_jax.parallel.distributed import initialize
        try:
            return initialize(coord.value, nproc.value, pid.value, auto=auto.value)
        except ValueError as e:
            cmd.fail(str(e), e)
    return start


def define_run_flags(cmd: Command):
    """--resume / --overwrite / --allow-change of the commands that write a run directory (train, sft)."""
    resume = flags.DEFINE_bool("resume", False, "continue from the newest usable checkpoint in output.dir (fails, "
                                                "saying why, when none can be restored); settings that differ from "
                                                "the run's run_config.json are refused, each named old → new, "
                                                "unless --allow-change names them", flag_values=cmd.flags)
    overwrite = flags.DEFINE_bool("overwrite", False, "start afresh in an output.dir that already holds a run, "
                                                      "removing its checkpoints and records", flag_values=cmd.flags)
    allow = flags.DEFINE_list("allow-change", [], "with --resume: settings (section.field, or a whole section) "
                              "the resumed run may change, e.g. --allow-change=optim.lr,train.seed; recorded in "
                              "output.dir/provenance.jsonl. Never needed for train.steps (nor sft.epochs unless "
                              "the lr schedule spans them), output paths and cadences, or layout (mesh.shape, "
                              "rollout.chunk_rows, ...): "
                              "run/run_dir.py lists them with why", flag_values=cmd.flags)
    return resume, overwrite, allow


def check_resume_changes(cmd: Command, resume, allow) -> None:
    """--allow-change names settings that exist and comes with --resume; a resume's settings that differ
    from its run_config.json are refused unless allowed (run.run_dir.check_resume, read-only): each a
    one-line mistake (exit 2) before any model loads. The trainers check again as they start."""
    if allow.value and not resume.value:
        cmd.fail(f"--allow-change={','.join(allow.value)} accepts changed settings of a resumed run: add --resume "
                 "(a fresh run takes any settings)")
    if not resume.value:
        return
    from dart_jax.errors import UserError
    from dart_jax.run.run_dir import RunDirError, check_resume
    try:
        check_resume(cmd.config.value.output.dir, cmd.config.value, allow.value)
    except (UserError, RunDirError) as e:
        cmd.fail(describe(e), e)
