"""The accelerator install files resolve on the hosts they are for, at the jax version the code is
tested with, without installing anything.

requirements-cuda12.txt (+ requirements-faiss-gpu.txt) and requirements-tpu.txt are resolved with uv
(requirements-test.txt) for Python 3.11 on Linux x86_64 at each file's glibc floor: a pin that has no
wheel there, or that conflicts with another (jax's CUDA library ranges against faiss's, numpy against
the plugins), fails here rather than on a GPU node. uv reads only the metadata of each wheel; pip's
`install --dry-run` on the same files downloads every wheel it considers (measured here: 3.2 GB, 45 s,
on an index that serves no separate metadata files), uv 47 MB in 6 s. The index is needed: without it
these tests fail and say so.

The pins themselves are checked against jax's own metadata (the `cuda12` and `tpu` extras of the
installed jax, which is the version requirements.txt pins): the accelerator files install what
`pip install "jax[cuda12]==X"` / `"jax[tpu]==X"` would.
"""

from __future__ import annotations

import importlib.metadata
import os
import subprocess

import pytest
from packaging.requirements import Requirement

ROOT = os.path.normpath(os.path.join(os.path.dirname(__file__), ".."))
PYTHON = "3.11"
# file(s) resolved together -> the oldest manylinux platform they are promised for (their comments)
RESOLVE = {
    "cuda12": (["requirements-cuda12.txt", "requirements-faiss-gpu.txt"], "x86_64-manylinux_2_28"),
    "tpu": (["requirements-tpu.txt"], "x86_64-manylinux_2_31"),
}
TIMEOUT_S = 120


def pins(name: str) -> dict[str, Requirement]:
    """The requirements written in one file (not those it includes with -r), by normalised name."""
    out = {}
    with open(os.path.join(ROOT, name)) as f:
        for line in f:
            line = line.split("#", 1)[0].strip()
            if line and not line.startswith("-"):
                req = Requirement(line)
                out[req.name.lower().replace("_", "-")] = req
    return out


def pinned_version(req: Requirement) -> str:
    (spec,) = req.specifier
    assert spec.operator == "==", f"{req} is not an exact pin"
    return spec.version


def includes_base(name: str) -> bool:
    with open(os.path.join(ROOT, name)) as f:
        return "-r requirements.txt" in [line.strip() for line in f]


def jax_extra(extra: str) -> dict[str, Requirement]:
    """The requirements jax's installed metadata lists for one extra."""
    out = {}
    for line in importlib.metadata.requires("jax"):
        req = Requirement(line)
        if req.marker is not None and req.marker.evaluate({"extra": extra}):
            out[req.name.lower().replace("_", "-")] = req
    return out


def test_installed_jax_is_the_pinned_one():
    base = pins("requirements.txt")
    assert importlib.metadata.version("jax") == pinned_version(base["jax"])
    assert importlib.metadata.version("jaxlib") == pinned_version(base["jaxlib"])


@pytest.mark.parametrize("name,extra", [("requirements-cuda12.txt", "cuda12"), ("requirements-tpu.txt", "tpu")])
def test_accelerator_pins_are_jax_extras(name, extra):
    """Every package of jax's extra (but jaxlib, pinned in requirements.txt) is pinned in the file at a
    version the extra allows, with the extra's own extras; jax and jaxlib come from requirements.txt only."""
    assert includes_base(name), f"{name} must include requirements.txt (-r requirements.txt)"
    ours, wanted = pins(name), jax_extra(extra)
    assert not {"jax", "jaxlib"} & set(ours), f"{name} pins jax / jaxlib itself; requirements.txt does"
    base = pins("requirements.txt")
    assert wanted["jaxlib"].specifier.contains(pinned_version(base["jaxlib"]))
    for pkg, req in wanted.items():
        if pkg == "jaxlib":
            continue
        assert pkg in ours, f"{name} lacks {req} (jax[{extra}] needs it)"
        assert req.specifier.contains(pinned_version(ours[pkg])), f"{name}: {ours[pkg]} is outside jax's {req}"
        assert req.extras <= ours[pkg].extras, f"{name}: {ours[pkg]} lacks the extras of jax's {req}"
    assert set(ours) == set(wanted) - {"jaxlib"} | ({"jax-cuda12-pjrt"} if extra == "cuda12" else set())


@pytest.fixture(scope="module")
def resolved(tmp_path_factory):
    """target -> (return code, {package: version} resolved, uv's stderr); both targets resolve at once."""
    try:
        from uv import find_uv_bin
    except ImportError:
        pytest.fail("uv is not installed: pip install -r requirements-test.txt")
    out_dir = tmp_path_factory.mktemp("resolved")
    env = dict(os.environ, UV_HTTP_TIMEOUT="30")
    procs = {}
    for target, (files, platform) in RESOLVE.items():
        cmd = [find_uv_bin(), "pip", "compile", *files, "--python-version", PYTHON, "--python-platform", platform,
               "--only-binary", ":all:", "--no-config", "--no-cache", "--no-header", "--no-annotate", "--quiet",
               "--output-file", str(out_dir / f"{target}.txt")]
        procs[target] = subprocess.Popen(cmd, cwd=ROOT, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
                                         text=True)
    out = {}
    for target, proc in procs.items():
        try:
            _, err = proc.communicate(timeout=TIMEOUT_S)
        except subprocess.TimeoutExpired:
            proc.kill()
            _, err = proc.communicate()
            err = f"no answer from the package index within {TIMEOUT_S} s\n{err}"
        versions = {}
        if proc.returncode == 0:
            with open(out_dir / f"{target}.txt") as f:
                for line in f:
                    name, _, version = line.strip().partition("==")
                    versions[name.lower()] = version
        out[target] = (proc.returncode, versions, err)
    return out


@pytest.mark.parametrize("target", sorted(RESOLVE))
def test_resolves_for_linux_x86_64(resolved, target):
    files, platform = RESOLVE[target]
    rc, versions, err = resolved[target]
    assert rc == 0, (f"{' + '.join(files)} did not resolve for Python {PYTHON} on {platform} (this needs the "
                     f"package index; uv says):\n{err}")
    base = pins("requirements.txt")
    for pkg in ("jax", "jaxlib", "numpy", "flax"):
        assert versions[pkg] == pinned_version(base[pkg])
    for name in files:
        for pkg, req in pins(name).items():
            assert versions[pkg] == pinned_version(req)
    if target == "cuda12":  # the CUDA libraries come as wheels, and one set serves jax and faiss
        assert {"nvidia-cudnn-cu12", "nvidia-cublas-cu12", "nvidia-nccl-cu12"} <= set(versions)
