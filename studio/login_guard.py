"""A guard in front of Gradio's `/login`: failed logins slow down per client, and the login
cookies are SameSite=Lax.

Gradio checks the password itself and has no hook that sees the request, so this is plain ASGI
middleware on its FastAPI app (handed in through `launch(app_kwargs=...)`). After FREE_FAILURES
failed attempts from one client address, each further attempt waits BASE_DELAY_S doubled per
failure (capped at MAX_DELAY_S) before Gradio checks it, and one client's attempts are checked one
at a time, so parallel guesses wait in line too; a success clears the count. Counts live in memory
(a restart clears them) and are forgotten after FORGET_AFTER_S without failures; at most
MAX_CLIENTS are tracked. The increasing delay is the scheme of OWASP's authentication cheat sheet
("exponential back-off") and of fail2ban-style per-address counting.

Gradio sets its secure login cookie with SameSite=None (for iframes on Hugging Face Spaces); a
studio is not embedded, so Lax is rewritten into the response (the other cookie already is Lax)."""
from __future__ import annotations

import asyncio
import time
from collections import OrderedDict
from dataclasses import dataclass, field
from typing import Any, Callable

FREE_FAILURES = 3
BASE_DELAY_S = 1.0
MAX_DELAY_S = 30.0
FORGET_AFTER_S = 15 * 60
MAX_CLIENTS = 10_000


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

    async def __call__(self, scope: dict, receive: Callable, send: Callable) -> None:
        if not _is_login(scope):
            await self.app(scope, receive, send)
            return
        address = (scope.get("client") or ("unknown", 0))[0]
        client = self._client(address)
        status: list[int] = []

        async def send_lax(message: dict) -> None:
            if message["type"] == "http.response.start":
                status.append(message["status"])
                message = {**message, "headers": _lax(list(message.get("headers", [])))}
            await send(message)

        async with client.lock:  # one attempt of a client at a time: parallel guesses queue up
            wait = delay_after(client.failures)
            if wait:
                await self.sleep(wait)
            await self.app(scope, receive, send_lax)
            if status and status[0] < 300:
                client.failures = 0
            elif status and status[0] in (400, 401, 403):
                client.failures += 1
                client.last_failure = self.clock()
