"""Nothing before login (studio/route_guard.py, issue 36 item 3): without the login cookie every route
but the login page and its static files answers 401, and the login page carries no API description,
no path, no job or dataset name; with the login everything answers as Gradio does."""
import re

import gradio as gr
import httpx
import pytest

from studio.route_guard import is_open, launch_kwargs

SECRETS = ("/srv/secret-data/datasets/customers.jsonl", "job-quarterly-finetune", "secret_endpoint")
MUST_BE_CLOSED = ["/config", "/info", "/gradio_api/info", "/openapi.json", "/gradio_api/openapi.json", "/docs",
                  "/redoc", "/gradio_api/runs", "/gradio_api/heartbeat/s", "/gradio_api/queue/status",
                  "/gradio_api/file=/etc/passwd", "/monitoring", "/gradio_api/custom_component/a/client/b/c"]
OPEN_BY_GRADIO = [("post", "/gradio_api/cancel", {"session_hash": "s", "fn_index": 0, "event_id": "e"}),
                  ("post", "/gradio_api/reset", {"session_hash": "s", "fn_index": 0, "event_id": "e"}),
                  ("post", "/gradio_api/stream/e", {}), ("post", "/gradio_api/vibe-edit", {})]


@pytest.fixture(scope="module")
def studio():
    """A launched page with a password whose components hold a dataset path and a job name, as the
    studio's dropdowns do; (its url, its FastAPI app)."""
    with gr.Blocks() as demo:
        box = gr.Textbox(value=SECRETS[0], label="Dataset")
        jobs = gr.Dropdown(choices=[SECRETS[1]], value=SECRETS[1], label="Job")
        gr.Button().click(lambda text, job: text, [box, jobs], box, api_name=SECRETS[2])
    demo.queue().launch(server_name="127.0.0.1", auth=("me", "secret"), prevent_thread_lock=True,
                        quiet=True, **launch_kwargs())
    yield demo.local_url.rstrip("/"), demo.app
    demo.close()


def every_route(app):
    """(method, path with its parameters filled in) of each route of Gradio's app, nested routers too."""
    found = []

    def walk(routes, prefix=""):
        for route in routes:
            if hasattr(route, "path"):
                method = "GET" if "GET" in (route.methods or {"GET"}) else sorted(route.methods)[0]
                found.append((method, re.sub(r"\{[^}]+\}", "x", prefix + route.path)))
            else:
                walk(route.original_router.routes, prefix + (route.include_context.prefix or ""))
    walk(app.routes)
    return found


def test_the_login_page_carries_no_api_description_path_or_name(studio):
    url, _ = studio
    page = httpx.get(url + "/", timeout=30, headers={"accept-encoding": "gzip"})
    assert page.status_code == 200 and "window.gradio_config" in page.text
    assert 'window.gradio_api_info = {"named_endpoints": {}, "unnamed_endpoints": {}};' in page.text
    for secret in SECRETS:
        assert secret not in page.text, secret
    assert '"auth_required": true' in page.text.replace('"auth_required":true', '"auth_required": true')


def test_every_route_but_the_login_page_and_its_files_needs_the_login(studio):
    url, app = studio
    routes = every_route(app)
    assert len(routes) > 60 and ("GET", "/gradio_api/info") in routes   # the walk found Gradio's API routes
    opened = []
    with httpx.Client(base_url=url, timeout=30) as client:
        answers = [(method, path, client.request(method, path))
                   for method, path in routes + [("GET", p) for p in MUST_BE_CLOSED]]
    for method, path, answer in answers:
        if is_open(path):
            opened.append(path)
            assert not any(secret in answer.text for secret in SECRETS), (path, answer.text[:300])
        else:
            assert answer.status_code == 401, (method, path, answer.status_code, answer.text[:200])
    assert not any(path in opened for path in MUST_BE_CLOSED)
    assert "/login" in opened and "/" in opened


@pytest.mark.parametrize("method,path,body", OPEN_BY_GRADIO)
def test_routes_gradio_leaves_open_need_the_login(studio, method, path, body):
    url, _ = studio
    response = getattr(httpx, method)(url + path, json=body, timeout=30)
    assert response.status_code == 401, (path, response.status_code, response.text[:200])


def test_with_the_login_they_answer_as_gradio_does(studio):
    url, _ = studio
    with httpx.Client(base_url=url, timeout=30) as client:
        assert client.post("/login", data={"username": "me", "password": "secret"}).status_code in (200, 302, 303)
        reset = client.post("/gradio_api/reset", json={"session_hash": "s", "fn_index": 0, "event_id": "e"})
        assert reset.status_code == 200, reset.text
        assert client.get("/gradio_api/openapi.json").status_code == 200   # Gradio's own, behind login
        assert client.get("/openapi.json").status_code == 404              # FastAPI's: switched off
        assert client.get("/config").status_code == 200
        assert SECRETS[2] in client.get("/").text                          # the logged-in page is Gradio's own
