"""An idle page and studio cost next to nothing (studio/quiet_page.py, issue 40 item 6): the page goes
out with the frame throttle first in its <head>, before Gradio's modules load; Gradio's queue checks
for work at its Windows pace, and an event still answers."""
import gradio as gr
import httpx
import pytest

from gradio_client import Client

from studio import quiet_page
from studio.route_guard import launch_kwargs


@pytest.fixture(scope="module")
def page():
    with gr.Blocks() as demo:
        box = gr.Textbox()
        gr.Button().click(lambda text: text.upper(), box, box, api_name="shout")
    quiet_page.calm_queue(demo.queue()).launch(server_name="127.0.0.1", prevent_thread_lock=True, quiet=True,
                                               **launch_kwargs([quiet_page.middleware()]))
    yield demo
    demo.close()


def test_the_page_carries_the_frame_throttle_before_gradio_loads(page):
    html = httpx.get(page.local_url, timeout=30, headers={"accept-encoding": "gzip"}).text
    head = html.split("<head>", 1)[1]
    assert head.startswith("<script data-ft-quiet>") and quiet_page.FRAME_THROTTLE_JS in head
    assert head.index("data-ft-quiet") < head.index('type="module"')   # before Gradio's own scripts
    assert html.count("data-ft-quiet") == 1
    assets = httpx.get(page.local_url.rstrip("/") + "/gradio_api/info", timeout=30)
    assert "data-ft-quiet" not in assets.text   # only the page is touched


def test_the_queue_waits_between_idle_checks_and_still_answers(page):
    assert page._queue.sleep_when_free == quiet_page.QUEUE_IDLE_SLEEP_S
    assert page._queue.progress_update_sleep_when_free == quiet_page.PROGRESS_IDLE_SLEEP_S
    assert Client(page.local_url, verbose=False).predict("idle", api_name="/shout") == "IDLE"


def test_only_an_html_page_is_edited():
    assert quiet_page.with_script(b"<html><head><title>x</title>") == (
        b"<html><head>" + quiet_page.SCRIPT + b"<title>x</title>")
    assert quiet_page.with_script(b"{}") == b"{}"
