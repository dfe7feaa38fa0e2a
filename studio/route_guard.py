"""Nothing before login: with a password set, a request without the login cookie reaches only the
login page, `/login` and the page's static files; everything else answers 401.

Gradio checks the login cookie on most of its routes, but not all (Gradio 6.31, gradio/routes.py):
`POST /gradio_api/cancel` and `/gradio_api/reset`, `GET /gradio_api/heartbeat/*`, the stream and
vibe-editor routes answer anyone, FastAPI's `/openapi.json` describes the whole API, and the login
page itself (`/`, also `/gradio_api/runs`) embeds `window.gradio_api_info`: every endpoint with its
parameters and example values, which in a studio are the absolute paths of its datasets and the
names of its jobs. Rather than list what Gradio leaves open (a newer Gradio may add a route), this
ASGI middleware turns it around: without the cookie Gradio itself checks (the same token table, so a
logged-in page works unchanged) only OPEN_PATHS / OPEN_PREFIXES pass, and the login page goes out
with an empty API description. FastAPI's schema routes are switched off altogether (Gradio serves
its own API description at /gradio_api/openapi.json, behind login). docs/SECURITY.md lists what
stays open and why it is harmless."""
from __future__ import annotations

import json
import re
from typing import Any

from starlette.middleware import Middleware
from starlette.requests import HTTPConnection

LOGIN_PAGE = "/"
# What the login page needs, and answers that tell a stranger nothing about the studio (SECURITY.md).
OPEN_PATHS = frozenset({LOGIN_PAGE, "/login", "/logout", "/favicon.ico", "/robots.txt", "/manifest.json",
                        "/theme.css", "/gradio_api/theme.css", "/gradio_api/login_check", "/gradio_api/token",
                        "/gradio_api/user", "/gradio_api/app_id",
                        "/gradio_api/startup-events"})   # launch() itself calls it, without a cookie
OPEN_PREFIXES = ("/assets/", "/static/", "/svelte/", "/pwa_icon")
API_INFO = re.compile(rb"window\.gradio_api_info = .*?;</script>", re.DOTALL)
NO_API_INFO = b'window.gradio_api_info = {"named_endpoints": {}, "unnamed_endpoints": {}};</script>'


def launch_kwargs(middleware: list | None = None) -> dict[str, Any]:
    """What `Blocks.launch` takes to guard the routes (module doc), after any other `middleware`
    (app.py's upload and failed-login guards)."""
    return {"app_kwargs": {"openapi_url": None, "docs_url": None, "redoc_url": None,
                           "middleware": [*(middleware or []), Middleware(RouteGuard)]}}


class RouteGuard:
    def __init__(self, app):
        self.app = app

    async def __call__(self, scope, receive, send):
        if scope["type"] not in ("http", "websocket") or _logged_in(scope):
            await self.app(scope, receive, send)
        elif not is_open(scope.get("path", "")):
            await _not_authenticated(scope, send)
        elif _normal(scope.get("path", "")) == LOGIN_PAGE and scope.get("method") == "GET":
            await self.app(_uncompressed(scope), receive, _without_api_info(send))
        else:
            await self.app(scope, receive, send)


def _normal(path: str) -> str:
    path = "/" + path.lstrip("/")
    return path if path == "/" else path.rstrip("/")


def is_open(path: str) -> bool:
    """Whether `path` answers without the login (module doc)."""
    path = _normal(path)
    return path in OPEN_PATHS or any(path.startswith(prefix) or path + "/" == prefix for prefix in OPEN_PREFIXES)


async def _not_authenticated(scope, send) -> None:
    if scope["type"] == "websocket":
        await send({"type": "websocket.close", "code": 1008})
        return
    body = json.dumps({"error": "Not authenticated"}).encode()
    await send({"type": "http.response.start", "status": 401,
                "headers": [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode())]})
    await send({"type": "http.response.body", "body": body})


def _uncompressed(scope) -> dict:
    """The request without Accept-Encoding, so that the page comes back as text the guard can edit."""
    return {**scope, "headers": [(k, v) for k, v in scope.get("headers", []) if k.lower() != b"accept-encoding"]}


def _without_api_info(send):
    """A `send` that holds the login page back until its end and replaces its API description."""
    held: dict = {}
    chunks: list[bytes] = []

    async def send_page(message: dict) -> None:
        if message["type"] == "http.response.start":
            held.update(message)
            return
        if message["type"] != "http.response.body":
            await send(message)
            return
        chunks.append(message.get("body", b""))
        if message.get("more_body"):
            return
        headers = [(k, v) for k, v in held.get("headers", []) if k.lower() != b"content-length"]
        if any(k.lower() == b"content-encoding" for k, _ in headers):   # cannot be edited: give nothing away
            await _not_authenticated({"type": "http"}, send)
            return
        body = API_INFO.sub(NO_API_INFO, b"".join(chunks))
        await send({**held, "headers": [*headers, (b"content-length", str(len(body)).encode())]})
        await send({"type": "http.response.body", "body": body})
    return send_page


def _logged_in(scope) -> bool:
    """Gradio's own check (routes.py get_current_user): no auth configured, or a known token."""
    app = scope.get("app")
    if app is None or (getattr(app, "auth", None) is None and getattr(app, "auth_dependency", None) is None):
        return True
    cookies = HTTPConnection(scope).cookies
    cookie_id = getattr(app, "cookie_id", "")
    token = cookies.get(f"access-token-{cookie_id}") or cookies.get(f"access-token-unsecure-{cookie_id}")
    return getattr(app, "tokens", {}).get(token) is not None
