"""The serving tests' fixtures: tests/serve_setup.py's tiny engine setup, and a tiny trained DART run
(tests/trained_run.py) with its retrieval server."""

import pytest

from serve_setup import serve_setup  # noqa: F401
from trained_run import passage_server, searching_qwen2, train_tiny_run


@pytest.fixture(scope="session")
def trained(tmp_path_factory, tiny_smollm_dir):
    """(run directory, its retrieval server)."""
    server = passage_server(tmp_path_factory.mktemp("tiny_index"))
    qwen = searching_qwen2(str(tmp_path_factory.mktemp("tiny_qwen2")), tiny_smollm_dir)
    yield train_tiny_run(qwen, server.url, tmp_path_factory.mktemp("run")), server
    server.stop()
