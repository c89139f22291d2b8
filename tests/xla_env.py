"""XLA flags of the test suite, for conftest.py and for the tests that start CLI subprocesses.

XLA:CPU's LLVM back end runs at its lowest optimisation level: the suite's programs are tiny models
whose compile time dominates their run time (measured on 2 cores: tests/rl/test_train_step.py 242 s ->
143 s, tests/experiments/test_grad_roles.py 128 s -> 87 s). No fast-math is turned on and every parity
test passes at its stated tolerance, but fp32 reduction orders change (tests/parallel/test_multihost.py:
one process against two differ by 8.1e-6 here, 3.8e-6 at XLA's defaults)."""

OPT_FLAGS = "--xla_backend_optimization_level=0 --xla_llvm_disable_expensive_passes=true"


def xla_flags(devices: int) -> str:
    """XLA_FLAGS for a process with `devices` forced host devices and the suite's compile settings."""
    return f"--xla_force_host_platform_device_count={devices} {OPT_FLAGS}"
