"""dart_jax's layers, checked from the source: which package may import which, written once as an
explicit graph (ALLOWED), plus the two top-level directories beside the library, configs/ and launch/.

Every import counts: module-level, inside functions, relative, and `importlib.import_module("dart_jax.x")`.
The rules:
  - a file imports its own package, the base modules (BASE: dart_jax/errors.py), and the packages its
    package lists in ALLOWED; nothing else of dart_jax, configs or launch;
  - the library never imports configs/ or launch/ (a run's settings reach it as arguments); configs/ may
    import the library, never launch/; launch/ may import both;
  - no file imports another package's private (_underscored) names or modules;
  - no import cycle between files;
  - every listed edge is used (the graph is the true picture, not a wish), the graph has no cycle, and
    every package has a tests/<package>/ directory.

    python -m pytest tests/test_layers.py
"""

import ast
import os

ROOT = os.path.normpath(os.path.join(os.path.dirname(__file__), ".."))

BASE = ("errors",)  # top-level modules below every package (dart_jax/errors.py): anything may import them
TOP = ("configs", "launch")  # directories beside dart_jax/: run settings, command lines

# What each node may import besides itself and BASE, bottom-up: the edges in use, no more.
ALLOWED = {
    # mesh rules; the role vocabulary and router ψ; datasets, prompts, paths, normalisation
    "parallel": set(),
    "roles": set(),
    "data": set(),
    # CEA statistics, gradient geometry, figures, markdown tables: numpy / scipy / matplotlib / jax only
    "analysis": set(),
    # architecture, params, KV cache, LoRA delta, model names
    "models": {"parallel"},
    # tokenizers, sentinel tags and their rows
    "tokenization": {"data", "models", "roles"},
    # HF / GGUF / PEFT / DART / authors' files
    "checkpoints": {"data", "models", "parallel", "roles", "tokenization"},
    # method variants and isolation
    "adapters": {"checkpoints", "models", "roles"},
    # retrieval, SQLite
    "tools": {"checkpoints", "data", "models"},
    # EM, EX, training rewards
    "rewards": {"data", "tools"},
    # sampler, agent loop, protocol, tasks
    "rollout": {"adapters", "data", "models", "parallel", "roles", "tokenization"},
    # the lab: a generated multi-hop world, its questions, demonstrations from gold chains, role skill metrics
    "lab": {"analysis", "data", "rewards", "rollout"},
    # what a run is: its spec, policy on a mesh, task tool and rows, run directory, loop, records
    "run": {"adapters", "analysis", "checkpoints", "data", "lab", "models", "parallel", "rewards", "rollout", "tools"},
    # GRPO: losses, step, stages, the trainer
    # rl → serve: GRPO's rollouts on the serving engine (rollout.train_engine=continuous)
    "rl": {"adapters", "checkpoints", "data", "lab", "models", "parallel", "rewards", "roles", "rollout", "run",
           "serve", "tokenization"},
    # warm start
    "sft": {"checkpoints", "data", "lab", "rewards", "rl", "roles", "rollout", "run", "tokenization", "tools"},
    # the continuous-batching engine, the OpenAI-compatible server, ask / chat, exports
    "serve": {"adapters", "checkpoints", "data", "models", "roles", "rollout", "tokenization"},
    # evaluation (never the trainer's internals)
    "eval": {"adapters", "analysis", "checkpoints", "data", "lab", "models", "parallel", "rewards", "rollout", "run",
             "serve", "tools"},
    # PyTorch cross-checks
    "parity": {"adapters", "analysis", "checkpoints", "data", "models", "rl", "roles", "run", "tokenization"},
    # benchmarks
    "bench": {"adapters", "analysis", "checkpoints", "data", "models", "parallel", "parity", "rl", "roles", "rollout",
              "run", "serve", "tokenization", "tools"},
    # a run's fit to its machine before it starts
    "preflight": {"adapters", "bench", "models", "parallel", "rl", "rollout", "run"},
    # the CEA, gradient and methods studies: stage drivers, sampling, role gradients, archive, reports
    "experiments": {"adapters", "analysis", "eval", "lab", "parallel", "rewards", "rl", "roles", "rollout", "run",
                    "tokenization"},
    # run settings (ml_collections): the defaults (run.spec's dataclasses), data and evaluation sets, the
    # methods study's per-method settings
    "configs": {"data", "eval", "experiments", "run"},
    # command lines
    "launch": {"adapters", "analysis", "bench", "configs", "data", "eval", "experiments", "lab", "parallel",
               "parity", "preflight", "rl", "rollout", "run", "serve", "sft", "tokenization", "tools"},
}
LIBRARY = [node for node in ALLOWED if node not in TOP]

# packages whose tests live somewhere other than tests/<package>/, and why
TESTED_ELSEWHERE: dict[str, str] = {}
# tests/ folders that mirror no package, and what they hold
TEST_FOLDERS = {"recipes": "the rehearsals of docs/recipes/", "standins": "published-format stand-ins for tests"}


# --- reading the source -------------------------------------------------------------------------

def files(root: str = ROOT):
    """(relative path, module name) of every .py file under dart_jax/, configs/ and launch/."""
    for top in ("dart_jax", *TOP):
        for folder, dirs, names in os.walk(os.path.join(root, top)):
            dirs[:] = sorted(d for d in dirs if d != "__pycache__")
            for name in sorted(names):
                if name.endswith(".py"):
                    rel = os.path.relpath(os.path.join(folder, name), root).replace(os.sep, "/")
                    parts = rel[:-3].split("/")
                    yield rel, ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _dynamic(call: ast.Call) -> str | None:
    """The module of `importlib.import_module("m")` / `__import__("m")`; a formatted string gives its
    constant dotted prefix (f"dart_jax.rl.{x}" → dart_jax.rl)."""
    f = call.func
    name = f.attr if isinstance(f, ast.Attribute) else f.id if isinstance(f, ast.Name) else None
    if name not in ("import_module", "__import__") or not call.args:
        return None
    arg = call.args[0]
    if isinstance(arg, ast.Constant) and isinstance(arg.value, str):
        return arg.value
    if isinstance(arg, ast.JoinedStr) and arg.values and isinstance(arg.values[0], ast.Constant):
        return ".".join(str(arg.values[0].value).split(".")[:-1]) or None
    return None


def imports(path: str, module: str):
    """(line, imported module, imported name or None) for every import anywhere in the file: module
    level, in functions, relative (resolved against `module`), and importlib string imports."""
    tree = ast.parse(open(path).read(), path)
    package = module if path.endswith("__init__.py") else module.rpartition(".")[0]
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                anchor = package.split(".")[:len(package.split(".")) - node.level + 1]
                base = ".".join(anchor + ([base] if base else []))
            for a in node.names:
                yield node.lineno, base, a.name
        elif isinstance(node, ast.Import):
            for a in node.names:
                yield node.lineno, a.name, None
        elif isinstance(node, ast.Call) and (target := _dynamic(node)):
            yield node.lineno, target, None


def node_of(module: str, name: str | None = None) -> str | None:
    """The graph node a module belongs to: a dart_jax package, "base", "configs", "launch", or None
    (outside the project). `from dart_jax import rl` names the package through `name`."""
    parts = module.split(".")
    if parts[0] in TOP:
        return parts[0]
    if parts[0] != "dart_jax":
        return None
    sub = parts[1] if len(parts) > 1 else name
    if sub is None or sub == "*":
        return None
    return "base" if sub in BASE else sub


def _private(module: str, name: str | None) -> str | None:
    for part in module.split(".") + ([name] if name else []):
        if part.startswith("_") and not part.startswith("__"):
            return part
    return None


# --- the rules ----------------------------------------------------------------------------------

def reaches(graph: dict, start: str, goal: str) -> bool:
    seen, todo = set(), [start]
    while todo:
        node = todo.pop()
        if node == goal:
            return True
        if node not in seen:
            seen.add(node)
            todo.extend(graph.get(node, ()))
    return False


def why_not(own: str, target: str) -> str | None:
    """None when `own` may import `target`, else the rule it breaks."""
    if target in (own, "base"):
        return None
    if own == "base":
        return "a base module imports nothing of the project"
    if target in TOP and own not in TOP:
        return f"the library never imports {target}/"
    if target in ALLOWED.get(own, ()):
        return None
    if target not in ALLOWED:
        return f"{target} is not a node of ALLOWED"
    if reaches(ALLOWED, target, own):
        return f"upward: {target} sits above {own}"
    return f"{own} → {target} is not in ALLOWED (sideways or new: add the edge if it belongs)"


def violations(root: str = ROOT) -> list[str]:
    bad = []
    for rel, module in files(root):
        own = node_of(module)
        if own is None:  # dart_jax/__init__.py
            continue
        for line, imported, name in imports(os.path.join(root, rel), module):
            target = node_of(imported, name)
            if target is None:
                continue
            rule = why_not(own, target)
            if rule:
                shown = f"{imported}.{name}" if name and "." not in imported else imported  # `from configs import base`
                bad.append(f"{rel}:{line} imports {shown}: {rule}")
            elif target != own and (private := _private(imported, name)):
                bad.append(f"{rel}:{line} imports the private name {private} of {imported}")
    return list(dict.fromkeys(bad))


def file_graph(root: str = ROOT) -> dict[str, dict[str, int]]:
    """File → {imported file: first line}, over dart_jax/, configs/ and launch/. `from a.b import c`
    points at a/b/c.py when that is a module, else at a/b; parent packages' __init__ files are not edges."""
    rels = dict((module, rel) for rel, module in files(root))
    graph = {}
    for module, rel in rels.items():
        out = graph.setdefault(rel, {})
        for line, imported, name in imports(os.path.join(root, rel), module):
            candidates = ([f"{imported}.{name}"] if name else []) + [imported]
            target = next((rels[c] for c in candidates if c in rels), None)
            if target and target != rel:
                out.setdefault(target, line)
    return graph


def strongly_connected(graph: dict) -> list[list[str]]:
    """Tarjan's components of more than one node, each sorted (iterative, no recursion limit)."""
    index, low, on, stack, found, counter = {}, {}, set(), [], [], [0]
    for start in sorted(graph):
        if start in index:
            continue
        work = [(start, iter(sorted(graph[start])))]
        index[start] = low[start] = counter[0]
        counter[0] += 1
        stack.append(start)
        on.add(start)
        while work:
            node, children = work[-1]
            child = next(children, None)
            if child is not None:
                if child not in index:
                    index[child] = low[child] = counter[0]
                    counter[0] += 1
                    stack.append(child)
                    on.add(child)
                    work.append((child, iter(sorted(graph.get(child, ())))))
                elif child in on:
                    low[node] = min(low[node], index[child])
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[node])
            if low[node] == index[node]:
                component = []
                while True:
                    member = stack.pop()
                    on.discard(member)
                    component.append(member)
                    if member == node:
                        break
                if len(component) > 1:
                    found.append(sorted(component))
    return sorted(found)


def shortest_cycle(graph: dict, component: list[str]) -> list[str]:
    """A shortest cycle through the component's first file (breadth first inside the component)."""
    start, inside = component[0], set(component)
    parent, todo = {start: None}, [start]
    while todo:
        nxt = []
        for node in todo:
            for child in sorted(graph[node]):
                if child == start:
                    path = [node]
                    while parent[path[-1]] is not None:
                        path.append(parent[path[-1]])
                    return path[::-1] + [start]
                if child in inside and child not in parent:
                    parent[child] = node
                    nxt.append(child)
        todo = nxt
    raise AssertionError(f"no cycle through {start}")


def cycles(root: str = ROOT) -> list[str]:
    graph = file_graph(root)
    out = []
    for component in strongly_connected(graph):
        path = shortest_cycle(graph, component)
        hops = " → ".join(f"{a}:{graph[a][b]}" for a, b in zip(path, path[1:]))
        more = len(component) - (len(path) - 1)
        extra = f" (and {more} more files in the same knot)" if more else ""
        out.append(f"import cycle: {hops} → {path[-1]}{extra}")
    return out


# --- the tree as it is --------------------------------------------------------------------------

def packages(root: str = ROOT) -> set[str]:
    lib = os.path.join(root, "dart_jax")
    return {d for d in os.listdir(lib) if os.path.isfile(os.path.join(lib, d, "__init__.py"))}


def test_every_package_has_a_node():
    found, listed = packages(), set(LIBRARY)
    assert found == listed, f"add {sorted(found - listed)} to ALLOWED (or remove {sorted(listed - found)})"
    top = {n[:-3] for n in os.listdir(os.path.join(ROOT, "dart_jax")) if n.endswith(".py")} - {"__init__"}
    assert top == set(BASE), f"top-level modules of dart_jax/ {sorted(top)} must be the base modules {BASE}"


def test_the_graph_points_down():
    for node, targets in ALLOWED.items():
        assert targets <= set(ALLOWED) - {node}, f"{node} lists unknown nodes {sorted(targets - set(ALLOWED))}"
        if node not in TOP:
            assert not targets & set(TOP), f"library package {node} lists {sorted(targets & set(TOP))}"
    assert "launch" not in ALLOWED["configs"]
    assert not strongly_connected(ALLOWED), f"ALLOWED has a cycle: {strongly_connected(ALLOWED)}"


def test_imports_follow_the_graph():
    bad = violations()
    assert not bad, "imports outside the graph, or of private names:\n" + "\n".join(bad)


def test_every_allowed_edge_is_used():
    used = {(node_of(m), node_of(i, n)) for rel, m in files() for _, i, n in imports(os.path.join(ROOT, rel), m)}
    stale = sorted(f"{a} → {b}" for a, targets in ALLOWED.items() for b in targets if (a, b) not in used)
    assert not stale, f"edges in ALLOWED that no import uses (remove them): {stale}"


def test_no_import_cycle_between_files():
    found = cycles()
    assert not found, "\n".join(found)


def test_tests_mirror_the_package():
    tests = os.path.join(ROOT, "tests")
    folders = {d for d in os.listdir(tests) if os.path.isdir(os.path.join(tests, d)) and d != "__pycache__"}
    missing = sorted(p for p in LIBRARY if p not in TESTED_ELSEWHERE
                     and not any(n.startswith("test_") and n.endswith(".py")
                                 for n in (os.listdir(os.path.join(tests, p)) if p in folders else ())))
    assert not missing, f"packages without tests/<package>/test_*.py: {missing}"
    strays = sorted(folders - set(LIBRARY) - set(TEST_FOLDERS))
    assert not strays, f"tests/ folders that mirror no package: {strays} (name a package or list them in TEST_FOLDERS)"


# --- the checks catch what they claim -----------------------------------------------------------

def _plant(root, files_: dict[str, str]):
    for rel, body in files_.items():
        path = root / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(body)


def test_the_walk_reports_each_kind_of_violation(tmp_path):
    _plant(tmp_path, {
        "dart_jax/models/m.py": "from dart_jax.rl.step import LossConfig\n",
        "dart_jax/adapters/m.py": "import dart_jax.data.readers\n",
        "dart_jax/rl/m.py": "from dart_jax.rollout.agent import _private\n",
        "dart_jax/rl/n.py": "from dart_jax.rollout._hidden import x\n",
        "dart_jax/eval/m.py": "def f():\n    from dart_jax import bench\n",
        "dart_jax/rewards/m.py": "def f():\n    if True:\n        from dart_jax.rl import losses\n",
        "dart_jax/run/m.py": "def f():\n    from configs import base\n",
        "dart_jax/sft/m.py": "import launch.train\n",
        "dart_jax/tools/m.py": "import importlib\nmod = importlib.import_module('dart_jax.rl.trainer')\n",
        "dart_jax/data/m.py": "from ..rl import step\n",
        "dart_jax/errors.py": "from dart_jax.data import paths\n",
        "configs/m.py": "from launch import train\n",
        "launch/m.py": "from dart_jax.rl.trainer import _helper\nfrom configs import base\nimport dart_jax.rl\n",
    })
    found = "\n".join(violations(str(tmp_path)))
    assert "dart_jax/models/m.py:1 imports dart_jax.rl.step: upward: rl sits above models" in found
    assert "dart_jax/adapters/m.py:1 imports dart_jax.data.readers: adapters → data is not in ALLOWED" in found
    assert "dart_jax/rl/m.py:1 imports the private name _private of dart_jax.rollout.agent" in found
    assert "dart_jax/rl/n.py:1 imports the private name _hidden of dart_jax.rollout._hidden" in found
    assert "dart_jax/eval/m.py:2 imports dart_jax.bench: eval → bench is not in ALLOWED" in found
    assert "dart_jax/rewards/m.py:3 imports dart_jax.rl: upward: rl sits above rewards" in found
    assert "dart_jax/run/m.py:2 imports configs.base: the library never imports configs/" in found
    assert "dart_jax/sft/m.py:1 imports launch.train: the library never imports launch/" in found
    assert "dart_jax/tools/m.py:2 imports dart_jax.rl.trainer: upward: rl sits above tools" in found
    assert "dart_jax/data/m.py:1 imports dart_jax.rl: upward: rl sits above data" in found
    assert "dart_jax/errors.py:1 imports dart_jax.data: a base module imports nothing of the project" in found
    assert "configs/m.py:1 imports launch.train: upward: launch sits above configs" in found
    assert "launch/m.py:1 imports the private name _helper of dart_jax.rl.trainer" in found
    assert found.count("\n") == 12, found  # launch's configs and rl imports are allowed


def test_the_walk_reports_a_sideways_edge(tmp_path):
    _plant(tmp_path, {"dart_jax/rewards/m.py": "from dart_jax.adapters.method import MethodSpec\n"})
    assert violations(str(tmp_path)) == [
        "dart_jax/rewards/m.py:1 imports dart_jax.adapters.method: "
        "rewards → adapters is not in ALLOWED (sideways or new: add the edge if it belongs)"]


def test_the_walk_reports_a_file_cycle(tmp_path):
    _plant(tmp_path, {
        "dart_jax/__init__.py": "",
        "dart_jax/bench/__init__.py": "",
        "dart_jax/bench/a.py": "import os\nfrom dart_jax.bench import b\n",
        "dart_jax/bench/b.py": "def f():\n    from dart_jax.bench.a import g\n",
        "dart_jax/bench/c.py": "from dart_jax.bench.a import g\n",  # into the cycle, not part of it
        "dart_jax/rl/__init__.py": "from dart_jax.rl.x import y\n",
        "dart_jax/rl/x.py": "from . import z\n",
        "dart_jax/rl/z.py": "from dart_jax.rl import w\n",
        "dart_jax/rl/w.py": "import importlib\nimportlib.import_module('dart_jax.rl.x')\n",
    })
    assert cycles(str(tmp_path)) == [
        "import cycle: dart_jax/bench/a.py:2 → dart_jax/bench/b.py:2 → dart_jax/bench/a.py",
        "import cycle: dart_jax/rl/w.py:2 → dart_jax/rl/x.py:1 → dart_jax/rl/z.py:1 → dart_jax/rl/w.py"]
