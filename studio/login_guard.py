"""A guard in front of Gradio's `/login`: failed logins slow down per client, all clients together
get at most GUESSES_PER_MINUTE password checks that fail, and the login cookies are SameSite=Lax.

Gradio checks the password itself and has no hook that sees the request, so this is plain ASGI
middleware on its FastAPI app (handed in through `launch(app_kwargs=...)`).

Who a client is: the connection's own peer address (`scope["client"]`), an IPv6 address by its /64
network (one host holds a whole /64). uvicorn rewrites that address from X-Forwarded-For only for
the proxies the operator names with `--trusted-proxy` (app.py sets FORWARDED_ALLOW_IPS; by default
nothing is trusted, not even loopback), so a client cannot choose the key by writing a header.

Per client: after FREE_FAILURES failed attempts, each further attempt waits BASE_DELAY_S doubled per
failure (capped at MAX_DELAY_S) before Gradio checks it, and one client's attempts are checked one at
a time, so parallel guesses wait in line too; a success clears the count. Counts live in memory (a
restart clears them) and are forgotten after FORGET_AFTER_S without failures; at most MAX_CLIENTS are
tracked. This is the exponential back-off of OWASP's authentication cheat sheet and fail2ban-style
per-address counting.

For everyone together: a client with many source addresses (a botnet, or 127.0.0.x on one machine)
starts each address at zero, so a sliding window also counts the failed password checks of all
clients. Once GUESSES_PER_MINUTE failed in the last WINDOW_S seconds, further attempts are locked
out until the oldest leaves the window: Gradio does not check them, and they get the same answer as
a wrong password (a replay of Gradio's own), after the same per-client wait and about as long as a
check takes, so a guesser cannot tell a lockout from a wrong guess, and a right guess made during the
lockout is lost. The price: while someone outguesses the ceiling, a real user's login may be
refused too; it works again a minute after the guessing stops.

Gradio sets its secure login cookie with SameSite=None (for iframes on Hugging Face Spaces); a
studio is not embedded, so Lax is rewritten into the response (the other cookie already is Lax)."""
from __future__ import annotations

import asyncio
import ipaddress
import time
from collections import OrderedDict, deque
from dataclasses import dataclass, field
from typing import Any, Callable

FREE_FAILURES = 3
BASE_DELAY_S = 1.0
MAX_DELAY_S = 30.0
FORGET_AFTER_S = 15 * 60
MAX_CLIENTS = 10_000
GUESSES_PER_MINUTE = 20   # failed password checks of all clients together (README states it)
WINDOW_S = 60.0
FAILED = (400, 401, 403)
# Gradio's answer to a wrong password (gradio/routes.py login), replayed before one was seen.
WRONG_PASSWORD = [{"type": "http.response.start", "status": 400,
                   "headers": [(b"content-length", b"34"), (b"content-type", b"application/json")]},
                  {"type": "http.response.body", "body": b'{"detail":"Incorrect credentials."}'}]


@dataclass
class _Client:
    failures: int = 0
    last_failure: float = 0.0
    lock: asyncio.Lock = field(default_factory=asyncio.Lock)


def delay_after(failures: int) -> float:
    """Seconds an attempt waits after `failures` failed ones: none for the first few, then doubling."""
    if failures < FREE_FAILURES:
        return 0.0
    return min(MAX_DELAY_S, BASE_DELAY_S * 2 ** (failures - FREE_FAILURES))


def client_key(scope: dict) -> str:
    """The peer address uvicorn gives (module doc); an IPv6 one by its /64 network."""
    host = (scope.get("client") or ("unknown", 0))[0]
    try:
        address = ipaddress.ip_address(host)
    except ValueError:
        return host
    if address.version == 6:
        if address.ipv4_mapped is not None:
            return str(address.ipv4_mapped)
        return str(ipaddress.ip_network(f"{address}/64", strict=False))
    return str(address)


def _is_login(scope: dict) -> bool:
    path = scope.get("path", "").rstrip("/")
    return scope["type"] == "http" and scope.get("method") == "POST" and path.endswith("/login")


def _lax(headers: list[tuple[bytes, bytes]]) -> list[tuple[bytes, bytes]]:
    out = []
    for name, value in headers:
        if name.lower() == b"set-cookie":
            value = value.replace(b"SameSite=none", b"SameSite=lax").replace(b"samesite=none", b"samesite=lax")
        out.append((name, value))
    return out


class LoginGuard:
    def __init__(self, app: Any, clock: Callable[[], float] = time.monotonic, sleep=asyncio.sleep):
        self.app, self.clock, self.sleep = app, clock, sleep
        self.clients: OrderedDict[str, _Client] = OrderedDict()
        self.checks: deque[float] = deque()   # when each failed (or running) check of the window began
        self.wrong_answer: list[dict] = WRONG_PASSWORD
        self.check_s = 0.0                    # how long Gradio's last failed check took

    def _client(self, address: str) -> _Client:
        now = self.clock()
        stale = [key for key, known in self.clients.items()
                 if now - known.last_failure > FORGET_AFTER_S and not known.lock.locked()]
        for key in stale:
            del self.clients[key]
        client = self.clients.setdefault(address, _Client())
        self.clients.move_to_end(address)
        while len(self.clients) > MAX_CLIENTS:
            self.clients.popitem(last=False)
        return client

    def _reserve_check(self) -> float | None:
        """A place in the window for one password check (its start time), or None: locked out."""
        now = self.clock()
        while self.checks and now - self.checks[0] >= WINDOW_S:
            self.checks.popleft()
        if len(self.checks) >= GUESSES_PER_MINUTE:
            return None
        self.checks.append(now)
        return now

    async def __call__(self, scope: dict, receive: Callable, send: Callable) -> None:
        if not _is_login(scope):
            await self.app(scope, receive, send)
            return
        client = self._client(client_key(scope))
        async with client.lock:  # one attempt of a client at a time: parallel guesses queue up
            wait = delay_after(client.failures)
            if wait:
                await self.sleep(wait)
            began = self._reserve_check()
            if began is None:
                status = await self._locked_out(send)
            else:
                status = await self._check(scope, receive, send, began)
            if status is not None and status < 300:
                client.failures = 0
            elif status in FAILED:
                client.failures += 1
                client.last_failure = self.clock()

    async def _check(self, scope: dict, receive: Callable, send: Callable, began: float) -> int | None:
        """Gradio checks the password; its answer goes out with Lax cookies, and a wrong-password
        answer is kept for replay. A check that did not fail gives its place in the window back."""
        sent: list[dict] = []

        async def send_lax(message: dict) -> None:
            if message["type"] == "http.response.start":
                message = {**message, "headers": _lax(list(message.get("headers", [])))}
            sent.append(message)
            await send(message)

        try:
            await self.app(scope, receive, send_lax)
        finally:
            status = sent[0]["status"] if sent else None
            if status not in FAILED:
                self._release(began)
        if status in FAILED:
            self.wrong_answer, self.check_s = [dict(m) for m in sent], max(0.0, self.clock() - began)
        return status

    def _release(self, began: float) -> None:
        try:
            self.checks.remove(began)
        except ValueError:
            pass  # already out of the window

    async def _locked_out(self, send: Callable) -> int:
        """No check: the last wrong-password answer, after about as long as a check takes."""
        if self.check_s:
            await self.sleep(self.check_s)
        for message in self.wrong_answer:
            await send(dict(message))
        return self.wrong_answer[0]["status"]
