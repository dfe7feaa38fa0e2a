"""The Train tab's preview of image-text rows: thumbnails beside the text, image tokens counted."""
import pytest

from jobs.spec import JobSpec
from studio.train_tab import preview_data
from tests.tiny import make_tiny_vision_model


@pytest.fixture(scope="module")
def vl_model(tmp_path_factory):
    return make_tiny_vision_model(tmp_path_factory.mktemp("vl") / "model")


def test_preview_shows_each_rows_thumbnail_and_its_image_tokens(vl_model, tmp_path, monkeypatch):
    monkeypatch.setenv("FUSETUNE_ALLOW_DIRS", str(vl_model))
    spec = JobSpec(model=str(vl_model), dataset="builtin:shapes")
    names = list(spec.to_dict())
    html = preview_data(tmp_path, names, [spec.to_dict()[n] for n in names])
    assert html.count('<img class="ft-thumb" src="data:image/png;base64,') == 3, html[:500]
    assert "&lt;|image_pad|&gt; x 16" in html and "How many" in html
    assert 'class="ft-answer"' in html
