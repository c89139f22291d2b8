"""The runtime never needs the reference side: nothing under dart_jax/ (outside parity/ and bench/, the
PyTorch cross-checks and side-by-side benchmarks) nor launch/ (outside the crosscheck and bench CLIs)
imports torch or peft, at module level or inside a function. README's main command installs neither
(requirements.txt); CI also runs it in an environment without them (.ci/runtime_smoke)."""

import ast
import os

ROOT = os.path.normpath(os.path.join(os.path.dirname(__file__), ".."))
REFERENCE_ONLY = ("torch", "peft")
ALLOWED = ("dart_jax/parity/", "dart_jax/bench/", "launch/crosscheck.py", "launch/bench.py")


def imported_modules(path: str) -> list[tuple[int, str]]:
    with open(path) as f:
        tree = ast.parse(f.read(), path)
    out = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            out += [(node.lineno, a.name) for a in node.names]
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            out.append((node.lineno, node.module))
    return out


def runtime_files() -> list[str]:
    files = []
    for top in ("dart_jax", "launch", "configs"):
        for root, _, names in os.walk(os.path.join(ROOT, top)):
            for name in names:
                rel = os.path.relpath(os.path.join(root, name), ROOT).replace(os.sep, "/")
                if name.endswith(".py") and not rel.startswith(ALLOWED):
                    files.append(rel)
    return sorted(files)


def test_the_scan_sees_the_runtime_and_skips_the_reference_side():
    files = runtime_files()
    assert "dart_jax/rl/trainer.py" in files and "launch/train.py" in files
    assert not [f for f in files if f.startswith("dart_jax/parity/")]
    # the scan would catch the reference side's own imports
    assert ("torch" in {m.split(".")[0]
                        for _, m in imported_modules(os.path.join(ROOT, "dart_jax/parity/torch_grpo.py"))})


def test_no_torch_or_peft_import():
    bad = [f"{rel}:{line} imports {mod}" for rel in runtime_files()
           for line, mod in imported_modules(os.path.join(ROOT, rel)) if mod.split(".")[0] in REFERENCE_ONLY]
    assert not bad, "runtime code must run without torch/peft:\n" + "\n".join(bad)
