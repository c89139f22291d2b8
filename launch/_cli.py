"""One convention for every `python -m launch.X`: absl flags on the command's own FlagValues
(`--flag=value`, `--config=FILE[:ARG]` with `--config.field=value` overrides where a config
exists, multi-word flags with dashes), `--help` printing the command's docstring (purpose and an
example) and its flags, a clear message and exit status 2 on a bad flag, quiet logging.

    CLI = Command("launch.X", __doc__, config=True)
    N = flags.DEFINE_integer("n", 4, "trajectories", flag_values=CLI.flags)

    def main(argv=None) -> int:
        args = CLI.parse(argv)          # positional arguments (e.g. a subcommand)
        ...

Each command owns its FlagValues, so commands can share flag names (--model, --out, --json) and
still be imported together (tests call several `main(argv)` in one process).
"""

from __future__ import annotations

import sys

from absl import flags
from ml_collections import config_flags

from launch._log import setup_logging

HELP = ("-h", "--help", "-help", "--helpfull")


class Command:
    def __init__(self, name: str, doc: str, config: bool = False, config_required: bool = False):
        self.prog, self.doc = name, doc.strip()
        self.flags = flags.FlagValues()
        self.config_required = config_required
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

    def parse(self, argv: list[str] | None = None) -> list[str]:
        """Parse `argv` (default sys.argv[1:]) -> positional arguments; --help prints and exits 0."""
        argv = list(sys.argv[1:] if argv is None else argv)
        if any(a in HELP for a in argv):
            print(self.usage())
            raise SystemExit(0)
        self.flags.unparse_flags()  # a second parse in one process starts from the defaults again
        if self.config is not None:
            self.config = self._define_config(argv)
        try:
            rest = self.flags([self.prog] + argv)
        except flags.Error as e:
            print(f"{self.prog}: {e}\n(--help lists the flags)", file=sys.stderr)
            raise SystemExit(2) from None
        if self.config_required and self.config.value is None:
            print(f"{self.prog}: --config=configs/NAME.py is required (--help for an example)", file=sys.stderr)
            raise SystemExit(2)
        setup_logging()
        return rest[1:]

    def value(self, name: str):
        return self.flags[name].value


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
            print(f"{cmd.prog}: {e}", file=sys.stderr)
            raise SystemExit(2) from None
    return start


def define_run_flags(cmd: Command):
    """--resume / --overwrite of the commands that write a run directory (train, sft)."""
    resume = flags.DEFINE_bool("resume", False, "continue from the newest usable checkpoint in output.dir (fails, "
                                                "saying why, when none can be restored)", flag_values=cmd.flags)
    overwrite = flags.DEFINE_bool("overwrite", False, "start afresh in an output.dir that already holds a run, "
                                                      "removing its checkpoints and records", flag_values=cmd.flags)
    return resume, overwrite
