"""Fixtures the studio tests share."""
import pytest

from tests.tiny import make_tiny_model


@pytest.fixture(scope="module")
def data_dir(tmp_path_factory):
    """A data dir whose model cache holds the tiny model (a folder the studio may read) and an empty
    datasets folder; one a test module."""
    root = tmp_path_factory.mktemp("studio-data")
    make_tiny_model(root / "models" / "tiny")
    (root / "datasets").mkdir()
    return root
