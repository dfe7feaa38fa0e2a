import os
import tempfile

import pytest

from tests.tiny import make_tiny_model


@pytest.fixture(scope="session")
def tiny_model(tmp_path_factory):
    return make_tiny_model(tmp_path_factory.mktemp("tiny") / "tiny-llama")


@pytest.fixture(scope="session")
def tiny_job(tmp_path_factory, tiny_model):
    """A finished job on the tiny llama (a few seconds of CPU training), shared by the export tests."""
    from tests.jobs.export_jobs import train_job
    return train_job(tmp_path_factory.mktemp("jobs"), tiny_model, "llama-job")


@pytest.fixture
def in_process_cli():
    """jobs.train.cli.main in this process changes the umask, the environment and the temp dir: undo."""
    umask, tempdir = os.umask(0o022), tempfile.tempdir
    os.umask(umask)
    environ = dict(os.environ)
    yield
    os.umask(umask)
    tempfile.tempdir = tempdir
    os.environ.clear()
    os.environ.update(environ)


@pytest.fixture(scope="session")
def tiny_vision_model(tmp_path_factory):
    """A tiny random Qwen2.5-VL with its tokenizer and PIL image processor (tests/tiny.py)."""
    from tests.tiny import make_tiny_vision_model
    return make_tiny_vision_model(tmp_path_factory.mktemp("tiny-vl") / "model")
