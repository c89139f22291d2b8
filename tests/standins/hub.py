"""A tiny Qwen2 in a local Hugging Face hub cache, laid out as `hf download` lays it out, standing in for
a paper model (Qwen/Qwen2.5-3B-Instruct, ...) that a user downloaded before a run.

The layout huggingface_hub writes and reads (its cache API, which dart_jax.models.names uses):

    <cache>/models--Org--Name/blobs/<etag>                 one file per distinct content
    <cache>/models--Org--Name/refs/main                    the commit hash `main` points at
    <cache>/models--Org--Name/snapshots/<commit>/<file>    relative symlinks into blobs/

A blob's name is the file's etag on the hub: the sha256 of the content for files stored with Git LFS
(the weights), the git blob sha1 for the others (config, tokenizer). The weights are tests/tiny_models.py's
random Qwen2; the tokenizer is SmolLM2's real one, read from the embedded GGUF, so prompts, chat
template and sentinel tags behave as with a real model while the model stays tiny.
"""

from __future__ import annotations

import hashlib
import os
import tempfile

from huggingface_hub.file_download import repo_folder_name

import tiny_models
from dart_jax.tokenization.tokenizer import load_tokenizer

LFS_SUFFIXES = (".safetensors", ".bin", ".gguf")


def etag(name: str, data: bytes) -> str:
    """The hub's etag of a file: sha256 for Git LFS files, git's blob sha1 for the rest."""
    if name.endswith(LFS_SUFFIXES):
        return hashlib.sha256(data).hexdigest()
    return hashlib.sha1(b"blob %d\0" % len(data) + data).hexdigest()


def tiny_qwen2_in_hub_cache(cache_dir: str, repo_id: str, seed: int = 0) -> str:
    """Writes a tiny random Qwen2 with SmolLM2's tokenizer as `repo_id`'s `main` revision into the hub
    cache at `cache_dir` (what HF_HUB_CACHE names) -> its snapshot directory. The commit hash is derived
    from the files, so the same seed gives the same snapshot."""
    tok = load_tokenizer("smollm2-135m-instruct")
    repo_dir = os.path.join(cache_dir, repo_folder_name(repo_id=repo_id, repo_type="model"))
    with tempfile.TemporaryDirectory() as staging:
        tiny_models.build("qwen2", staging, seed=seed, vocab_size=len(tok), hidden_size=32, intermediate_size=48,
                          max_position_embeddings=2048, bos_token_id=1, eos_token_id=2, pad_token_id=2)
        tok.save_pretrained(staging)
        files = {}
        for root, _, names in os.walk(staging):
            for name in names:
                with open(os.path.join(root, name), "rb") as f:
                    files[os.path.relpath(os.path.join(root, name), staging)] = f.read()
    tags = {name: etag(name, data) for name, data in files.items()}
    commit = hashlib.sha1("".join(f"{n} {t}\n" for n, t in sorted(tags.items())).encode()).hexdigest()
    os.makedirs(os.path.join(repo_dir, "blobs"), exist_ok=True)
    os.makedirs(os.path.join(repo_dir, "refs"), exist_ok=True)
    snapshot = os.path.join(repo_dir, "snapshots", commit)
    for name, data in files.items():
        blob = os.path.join(repo_dir, "blobs", tags[name])
        with open(blob, "wb") as f:
            f.write(data)
        link = os.path.join(snapshot, name)
        os.makedirs(os.path.dirname(link), exist_ok=True)
        if not os.path.lexists(link):
            os.symlink(os.path.relpath(blob, os.path.dirname(link)), link)
    with open(os.path.join(repo_dir, "refs", "main"), "w") as f:
        f.write(commit)
    return snapshot
