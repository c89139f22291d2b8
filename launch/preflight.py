"""Check a training config before any model loads: retriever, databases, datasets, weights, the mesh
against the devices and the memory per device (XLA's analysis of the train step and the rollout's
decode at the config's shapes, nothing allocated). Prints one line per check; exit 0 when all pass,
2 when one fails (a memory failure names the mesh / decode layout / remat that fits).

    python -m launch.preflight --config=configs/paper_qa.py:dart,qwen2.5-3b-base
    python -m launch.preflight --config=configs/paper_qa.py:search_r1,qwen2.5-7b-base --devices=8 --device-memory-gib=80

--devices=N plans on N forced CPU devices (no accelerator needed; with --processes=P each of P
nodes holds N/P of them); with --device-memory-gib=G the memory check assumes devices of G GiB. On a
multi-node job run it like launch.train (--distributed, or --coordinator / --num-processes /
--process-id) so that it sees every node's devices. Without the weights, the architectures of the
paper's models shipped in data/model_configs stand in. launch.train runs the same checks unless
--skip-preflight.
"""

from __future__ import annotations

import json
import os
import sys
import time

from absl import flags

from launch._cli import Command, define_distributed_flags

CLI = Command("launch.preflight", __doc__, config=True, config_required=True)
DEVICES = flags.DEFINE_integer("devices", 0, "plan for N devices: N forced CPU devices (0: the devices at hand)",
                               flag_values=CLI.flags)
PROCESSES = flags.DEFINE_integer("processes", 0, "plan for N processes (nodes), each rolling out its share on its "
                                                 "own devices (0: this run's process count)", flag_values=CLI.flags)
MEMORY = flags.DEFINE_float("device-memory-gib", 0.0, "plan for devices of G GiB (0: the device's own limit; "
                                                      "skipped on CPU)", flag_values=CLI.flags)
PROMPT = flags.DEFINE_integer("prompt-tokens", 0, "prompt length the estimate assumes (0: 512 for QA, 2048 for "
                                                  "SQL's schema prompts)", flag_values=CLI.flags)
START = define_distributed_flags(CLI)
JSON = flags.DEFINE_string("json", "", "also write every check's figures to this JSON file", flag_values=CLI.flags)


def force_devices(n: int) -> None:
    """N host devices on the CPU backend, set before jax creates its backend."""
    flag = f"--xla_force_host_platform_device_count={n}"
    os.environ["XLA_FLAGS"] = " ".join(f for f in os.environ.get("XLA_FLAGS", "").split()
                                       if not f.startswith("--xla_force_host_platform_device_count")) + " " + flag
    os.environ["JAX_PLATFORMS"] = "cpu"
    import jax
    jax.config.update("jax_platforms", "cpu")


def main(argv: list[str] | None = None) -> int:
    CLI.parse(argv)
    if DEVICES.value:
        force_devices(DEVICES.value)
    else:
        START()
    from dart_jax.preflight import preflight
    t0 = time.perf_counter()
    report = preflight(CLI.config.value, processes=PROCESSES.value or None,
                       device_memory_gib=MEMORY.value or None, prompt_tokens=PROMPT.value or None,
                       log=lambda m: print(m, file=sys.stderr))
    for line in report.lines():
        print(line)
    print(f"preflight {'passed' if report.ok else 'failed'} in {time.perf_counter() - t0:.0f} s")
    if JSON.value:
        with open(JSON.value, "w") as f:
            json.dump(report.as_dict(), f, indent=2, default=str)
    return 0 if report.ok else 2


if __name__ == "__main__":
    CLI.run(main)
