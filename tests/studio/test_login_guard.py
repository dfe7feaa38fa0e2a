"""Failed logins slow down per client, a success clears the count, cookies become SameSite=Lax
(issue 23 item 5). Driven through Gradio's real /login route with a password."""

import gradio as gr
import httpx
import pytest

from tests.asgi_call import run_coroutine

from studio import login_guard
from studio.login_guard import FREE_FAILURES, LoginGuard, delay_after


def test_the_delay_grows_after_a_few_failures_and_is_capped():
    assert [delay_after(n) for n in range(FREE_FAILURES)] == [0.0] * FREE_FAILURES
    assert [delay_after(FREE_FAILURES + n) for n in range(4)] == [1.0, 2.0, 4.0, 8.0]
    assert delay_after(100) == login_guard.MAX_DELAY_S


@pytest.fixture
def guarded_app():
    """Gradio's own app for a one-button page with a password, wrapped as app.py wraps it."""
    with gr.Blocks() as demo:
        gr.Button("hi")
    demo.auth = [("me", "secret")]
    from gradio.routes import App
    app = App.create_app(demo)
    return app


def _post(app, guard, client, password):
    async def go():
        transport = httpx.ASGITransport(app=guard, client=(client, 1234))
        async with httpx.AsyncClient(transport=transport, base_url="http://127.0.0.1") as http:
            return await http.post("/login", data={"username": "me", "password": password})
    return run_coroutine(go)


def test_failed_logins_wait_longer_per_client_and_a_success_resets(guarded_app):
    waits = []

    async def fake_sleep(seconds):
        waits.append(seconds)

    guard = LoginGuard(guarded_app, sleep=fake_sleep)
    for _ in range(6):
        assert _post(guarded_app, guard, "10.0.0.1", "wrong").status_code == 400
    assert waits == [1.0, 2.0, 4.0]
    assert _post(guarded_app, guard, "10.0.0.2", "wrong").status_code == 400 and waits == [1.0, 2.0, 4.0]
    ok = _post(guarded_app, guard, "10.0.0.1", "secret")
    assert ok.status_code == 200 and waits == [1.0, 2.0, 4.0, 8.0]  # even the right password waits its turn
    cookies = ok.headers.get_list("set-cookie")
    assert cookies and all("samesite=lax" in c.lower() for c in cookies)
    assert not any("samesite=none" in c.lower() for c in cookies)
    assert guard.clients["10.0.0.1"].failures == 0
    _post(guarded_app, guard, "10.0.0.1", "wrong")
    assert waits[-1] == 8.0  # the success cleared the count: no wait for this first new failure
