"""The Chat tab with an image: a vision-language model sees the picture sent with the message."""
import pytest

from studio.chat import ChatEngine, Sampling
from studio.chat_tab import respond
from tests.tiny import make_tiny_vision_model


@pytest.fixture(scope="module")
def vl_model(tmp_path_factory):
    return make_tiny_vision_model(tmp_path_factory.mktemp("vl-chat") / "model")


def picture(path, colour):
    from PIL import Image
    Image.new("RGB", (56, 56), colour).save(path)
    return str(path)


def test_the_image_reaches_the_model_and_shows_in_the_chat(vl_model, tmp_path):
    from jobs.models.load import load_for_chat
    engine = ChatEngine(tmp_path, loader=load_for_chat)
    assert engine.reads_images(str(vl_model), None)
    greedy = Sampling(temperature=0.0, max_new_tokens=6)
    messages = [{"role": "user", "content": "What colour is it?"}]

    def answer(image):
        return list(engine.stream_batch(str(vl_model), None, [messages], greedy, [False], image=image))[-1][0]

    red, blue = answer(picture(tmp_path / "red.png", (255, 0, 0))), answer(picture(tmp_path / "blue.png", (0, 0, 255)))
    assert red != blue   # the pixels change the answer: the image went through the vision tower
    assert answer(str(tmp_path / "red.png")) == red
    *_, (_, tuned, base) = respond(engine, str(vl_model), None, "What colour is it?", [], [], greedy,
                                   image=str(tmp_path / "red.png"))
    assert base[0] == {"role": "user", "content": {"path": str(tmp_path / "red.png")}}
    assert base[1]["content"] == "What colour is it?" and base[2]["content"] == red and tuned == []
