"""Routes Gradio leaves open answer 401 without the login (studio/route_guard.py), and work with it."""
import gradio as gr
import httpx
import pytest

from studio.route_guard import launch_kwargs

OPEN_BY_GRADIO = [("post", "/gradio_api/cancel", {"session_hash": "s", "fn_index": 0, "event_id": "e"}),
                  ("post", "/gradio_api/reset", {"session_hash": "s", "fn_index": 0, "event_id": "e"}),
                  ("get", "/gradio_api/heartbeat/s", None), ("get", "/openapi.json", None)]


@pytest.fixture(scope="module")
def studio_url():
    with gr.Blocks() as demo:
        box = gr.Textbox()
        gr.Button().click(lambda text: text, box, box)
    demo.queue().launch(server_name="127.0.0.1", auth=("me", "secret"), prevent_thread_lock=True,
                        quiet=True, **launch_kwargs())
    yield demo.local_url.rstrip("/")
    demo.close()


@pytest.mark.parametrize("method,path,body", OPEN_BY_GRADIO)
def test_open_routes_need_the_login(studio_url, method, path, body):
    response = getattr(httpx, method)(studio_url + path, **({"json": body} if body else {}), timeout=30)
    assert response.status_code == 401, (path, response.status_code, response.text[:200])


def test_with_the_login_they_answer_as_gradio_does(studio_url):
    with httpx.Client(base_url=studio_url, timeout=30) as client:
        assert client.post("/login", data={"username": "me", "password": "secret"}).status_code in (200, 302, 303)
        reset = client.post("/gradio_api/reset", json={"session_hash": "s", "fn_index": 0, "event_id": "e"})
        assert reset.status_code == 200, reset.text
        assert client.get("/gradio_api/openapi.json").status_code == 200   # Gradio's own, behind login
        assert client.get("/openapi.json").status_code == 404              # FastAPI's: switched off
