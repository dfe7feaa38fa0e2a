import pytest

from tests.tiny import make_tiny_vision_model


@pytest.fixture(scope="session")
def tiny_vision_model(tmp_path_factory):
    return make_tiny_vision_model(tmp_path_factory.mktemp("tiny-vl") / "model")
