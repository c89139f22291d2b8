"""dart_jax's layers point down only: a module may import its own package, or a package in a lower
tier; never a higher tier, never a sibling in its own tier, and never another package's private
(_underscored) names. The order is written once, here:

    python -m pytest tests/test_layers.py
"""

import ast
import os

ROOT = os.path.normpath(os.path.join(os.path.dirname(__file__), ".."))

TIERS = [
    ("parallel", "roles"),   # mesh rules; the role vocabulary and router ψ
    ("models",),             # architecture, params, KV cache, LoRA delta, model names
    ("tokenization",),       # tokenizers, sentinel tags and their rows
    ("checkpoints",),        # HF / GGUF / PEFT / DART / authors' files
    ("adapters", "data"),    # method variants and isolation; datasets, prompts, paths, normalisation
    ("tools",),              # retrieval, SQLite
    ("rewards",),            # EM, EX, training rewards
    ("rollout",),            # sampler, agent loop, protocol, tasks
    ("run",),                # what a run is: policy on a mesh, task tool and rows, run directory, records
    ("rl",),                 # GRPO: losses, step, stages, the loop
    ("sft", "eval"),         # warm start; evaluation
    ("parity",),             # PyTorch cross-checks
    ("bench",),              # benchmarks
    ("preflight",),          # a run's fit to its machine before it starts: the trainer's rules, memory
    ("analysis",),           # CEA statistics and figures (numpy / scipy / matplotlib; no dart_jax import today)
]
TIER = {pkg: i for i, pkgs in enumerate(TIERS) for pkg in pkgs}


BASE = ("errors",)  # top-level modules below every tier (dart_jax/errors.py): any package may import them


def package_of(module: str) -> str | None:
    parts = module.split(".")
    return parts[1] if len(parts) > 1 and parts[0] == "dart_jax" and parts[1] not in BASE else None


def imports(path: str):
    tree = ast.parse(open(path).read(), path)
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            for a in node.names:
                yield node.lineno, node.module, a.name
        elif isinstance(node, ast.Import):
            for a in node.names:
                yield node.lineno, a.name, None


def modules(root: str = ROOT):
    for folder, _, names in os.walk(os.path.join(root, "dart_jax")):
        for name in sorted(names):
            if name.endswith(".py"):
                path = os.path.join(folder, name)
                yield os.path.relpath(path, root).replace(os.sep, "/"), path


def violations(root: str = ROOT) -> list[str]:
    bad = []
    for rel, path in modules(root):
        parts = rel.split("/")
        if len(parts) < 3:  # dart_jax/__init__.py
            continue
        own = parts[1]
        for line, module, name in imports(path):
            target = package_of(module)
            if module == "dart_jax" and name is not None and name not in BASE:
                target = name  # `from dart_jax import pkg`
            if target is None or target == own:
                continue
            if TIER[target] > TIER[own]:
                bad.append(f"{rel}:{line} imports {module} ({target}, tier {TIER[target]}) from tier {TIER[own]}")
            elif TIER[target] == TIER[own]:
                bad.append(f"{rel}:{line} imports its sibling {target} ({module})")
            elif name is not None and name.startswith("_"):
                bad.append(f"{rel}:{line} imports the private name {name} of {module}")
    return list(dict.fromkeys(bad))


def test_every_package_has_a_tier():
    packages = {d for d in os.listdir(os.path.join(ROOT, "dart_jax"))
                if os.path.isfile(os.path.join(ROOT, "dart_jax", d, "__init__.py"))}
    assert packages == set(TIER), f"add {sorted(packages - set(TIER))} to TIERS (or remove {sorted(set(TIER) - packages)})"


def test_imports_point_down():
    bad = violations()
    assert not bad, "upward, sideways or private imports:\n" + "\n".join(bad)


def test_the_walk_reports_each_kind_of_violation(tmp_path):
    for pkg, body in (("models", "from dart_jax.rl.step import LossConfig\n"),
                      ("adapters", "import dart_jax.data.readers\n"),
                      ("rl", "from dart_jax.rollout.agent import _private\n"),
                      ("eval", "def f():\n    from dart_jax import bench\n")):
        os.makedirs(tmp_path / "dart_jax" / pkg, exist_ok=True)
        (tmp_path / "dart_jax" / pkg / "m.py").write_text(body)
    found = "\n".join(violations(str(tmp_path)))
    assert "dart_jax/models/m.py:1 imports dart_jax.rl.step (rl, tier 9) from tier 1" in found
    assert "dart_jax/adapters/m.py:1 imports its sibling data" in found
    assert "dart_jax/rl/m.py:1 imports the private name _private" in found
    assert "dart_jax/eval/m.py:2 imports dart_jax (bench" in found
