import pytest

from tests.tiny import make_tokenizer


@pytest.fixture(scope="module")
def base_tokenizer():
    """The tiny tokenizer the chat-template tests dress in each family's template (templates.py)."""
    return make_tokenizer()
