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


# ---- a throttle the client cannot steer (issue 36 item 2) ----------------------------------------
class FakeTime:
    """The guard's clock and sleep: a wait advances the clock instead of taking time."""

    def __init__(self):
        self.now = 1000.0

    def clock(self):
        return self.now

    async def sleep(self, seconds):
        self.now += seconds


def counting(app, fake, check_s=0.0):
    """Gradio's app, counting the password checks that reach it (each taking `check_s` of fake time)."""
    async def counted(scope, receive, send):
        if scope["type"] == "http" and scope["path"] == "/login":
            counted.checks.append(fake.now)
            fake.now += check_s
        await app(scope, receive, send)
    counted.checks = []
    return counted


def _send(app, peer, password, forwarded=None):
    async def go():
        transport = httpx.ASGITransport(app=app, client=(peer, 1234))
        async with httpx.AsyncClient(transport=transport, base_url="http://127.0.0.1") as http:
            return await http.post("/login", data={"username": "me", "password": password},
                                   headers={"x-forwarded-for": forwarded} if forwarded else {})
    return run_coroutine(go)


def _checks_in_any_window(times):
    return max(sum(1 for t in times if start <= t < start + login_guard.WINDOW_S) for start in times)


def test_rotating_source_addresses_get_at_most_the_ceiling_of_checks_a_minute(guarded_app):
    fake = FakeTime()
    counted = counting(guarded_app, fake)
    guard = LoginGuard(counted, clock=fake.clock, sleep=fake.sleep)
    answers = [_send(guard, f"127.0.0.{i + 1}", "wrong") for i in range(50)]
    assert {(a.status_code, a.text) for a in answers} == {(400, '{"detail":"Incorrect credentials."}')}
    assert _checks_in_any_window(counted.checks) == login_guard.GUESSES_PER_MINUTE
    assert len(counted.checks) == login_guard.GUESSES_PER_MINUTE      # the other 30 were never checked
    locked = _send(guard, "127.0.0.99", "secret")   # the right guess while locked out: lost, answered as wrong
    assert (locked.status_code, locked.text, locked.headers.get_list("set-cookie")) == (answers[0].status_code,
                                                                                       answers[0].text, [])
    fake.now += login_guard.WINDOW_S   # a minute later the real user gets in
    assert _send(guard, "127.0.0.1", "secret").status_code == 200


def test_a_locked_out_attempt_takes_as_long_and_looks_the_same_as_a_wrong_password(guarded_app):
    fake = FakeTime()
    guard = LoginGuard(counting(guarded_app, fake, check_s=0.25), clock=fake.clock, sleep=fake.sleep)
    took = []
    for i in range(login_guard.GUESSES_PER_MINUTE + 2):
        began = fake.now
        answer = _send(guard, f"10.1.0.{i}", "wrong")
        took.append((fake.now - began, answer.status_code, answer.text, tuple(sorted(answer.headers.items()))))
    assert len(set(took)) == 1, took   # checked (the first 20) and locked out (the last 2) alike


def _behind_uvicorn(app_module, guard, trusted, monkeypatch):
    """`guard` inside uvicorn's own proxy-header handling, configured as app.py configures it."""
    import uvicorn
    monkeypatch.setenv("FORWARDED_ALLOW_IPS", "restored-after-the-test")
    app_module.trust_proxies(trusted)
    config = uvicorn.Config(app=guard, log_level="warning")   # as gradio/http_server.py makes it
    config.load()
    return config.loaded_app


def test_rotating_x_forwarded_for_counts_as_the_one_peer_without_a_trusted_proxy(guarded_app, monkeypatch):
    import app as app_module
    fake = FakeTime()
    counted = counting(guarded_app, fake)
    guard = LoginGuard(counted, clock=fake.clock, sleep=fake.sleep)
    served = _behind_uvicorn(app_module, guard, None, monkeypatch)
    began = fake.now
    for i in range(50):
        assert _send(served, "127.0.0.1", "wrong", forwarded=f"203.0.113.{i}").status_code == 400
    assert list(guard.clients) == ["127.0.0.1"] and guard.clients["127.0.0.1"].failures == 50
    # one client: its own back-off (1, 2, 4 ... 30 s) spaces the guesses far below the ceiling
    assert fake.now - began > 20 * login_guard.MAX_DELAY_S
    assert _checks_in_any_window(counted.checks) <= login_guard.GUESSES_PER_MINUTE


def test_a_trusted_proxy_names_the_client_and_the_ceiling_still_holds(guarded_app, monkeypatch):
    import app as app_module
    fake = FakeTime()
    counted = counting(guarded_app, fake)
    guard = LoginGuard(counted, clock=fake.clock, sleep=fake.sleep)
    served = _behind_uvicorn(app_module, guard, ["127.0.0.1"], monkeypatch)
    for i in range(50):
        assert _send(served, "127.0.0.1", "wrong", forwarded=f"203.0.113.{i}").status_code == 400
    assert len(guard.clients) == 50 and "203.0.113.7" in guard.clients
    assert len(counted.checks) == login_guard.GUESSES_PER_MINUTE
    with pytest.raises(SystemExit, match="--trusted-proxy 'proxy.local': not an IP address"):
        app_module.trust_proxies(["proxy.local"])


def test_an_ipv6_client_counts_by_its_network():
    assert login_guard.client_key({"client": ("2001:db8::1", 1)}) == login_guard.client_key(
        {"client": ("2001:db8::ffff:2", 1)}) == "2001:db8::/64"
    assert login_guard.client_key({"client": ("::ffff:127.0.0.3", 1)}) == "127.0.0.3"
