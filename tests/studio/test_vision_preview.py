"""The Train tab's preview of image-text rows: thumbnails beside the text, image tokens counted."""
import pytest

from jobs.spec import JobSpec
from studio.data_preview import preview_data
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


def test_the_model_picker_says_a_model_is_vision_language(vl_model, tmp_path, tiny_text_model, monkeypatch):
    import html as html_lib
    import os

    from studio.start_check import StartCheck
    from studio.train_start import fit_for_form
    monkeypatch.setenv("FUSETUNE_ALLOW_DIRS", os.pathsep.join([str(vl_model), str(tiny_text_model)]))
    # the picker's words, not the CPU step time beside them (a real step of each model in a child
    # process, 7-10 s apiece: tests/studio/test_cpu_time.py measures it)
    monkeypatch.setattr(StartCheck, "measure_step", lambda self, spec, source: 1e-3)
    check = StartCheck(tmp_path, free_memory=lambda _i: None)
    for model, expected in ((vl_model, "Vision-language model (Qwen2.5-VL): train it on image-text rows"),
                            (tiny_text_model, None)):
        spec = JobSpec(model=str(model))
        names = list(spec.to_dict())
        shown = html_lib.unescape(fit_for_form(check, names, [spec.to_dict()[n] for n in names], "en"))
        assert (expected in shown) if expected else ("Vision-language" not in shown), shown
    spec = JobSpec(model=str(vl_model))
    names = list(spec.to_dict())
    assert "视觉语言模型（Qwen2.5-VL）" in fit_for_form(check, names, [spec.to_dict()[n] for n in names], "zh-CN")


@pytest.fixture(scope="module")
def tiny_text_model(tmp_path_factory):
    from tests.tiny import make_tiny_model
    return make_tiny_model(tmp_path_factory.mktemp("text") / "model")
