"""Login for the routes Gradio leaves open.

With `auth` set, Gradio checks the login cookie on its page, config, file, upload, queue-join and
queue-data routes, but not on `POST /gradio_api/cancel` and `POST /gradio_api/reset` (they act on
a session's queued events, given its session hash and event id), nor `GET /gradio_api/heartbeat/*`
(it keeps a session alive), and FastAPI's own `/openapi.json` (the whole API's schema) answers
anyone (Gradio 6.31, gradio/routes.py). `RouteGuard` is an ASGI middleware that answers those with
401 unless the request carries the login cookie Gradio itself checks (the same token table, so a
logged-in page works unchanged); FastAPI's schema routes are switched off altogether (Gradio serves
its own API description at /gradio_api/openapi.json, behind login). What stays open by Gradio's design:
the login page and `/login`, `/gradio_api/login_check`, `/gradio_api/token`, `/gradio_api/app_id`,
and the static assets of the page."""
from __future__ import annotations

import json
from typing import Any

from starlette.middleware import Middleware
from starlette.requests import HTTPConnection

GUARDED_PREFIXES = ("/gradio_api/cancel", "/gradio_api/reset", "/gradio_api/heartbeat/", "/openapi.json",
                    "/docs", "/redoc")


def launch_kwargs(middleware: list | None = None) -> dict[str, Any]:
    """What `Blocks.launch` takes to guard the open routes (module doc), after any other `middleware`
    (app.py's upload and failed-login guards)."""
    return {"app_kwargs": {"openapi_url": None, "docs_url": None, "redoc_url": None,
                           "middleware": [*(middleware or []), Middleware(RouteGuard)]}}


class RouteGuard:
    def __init__(self, app):
        self.app = app

    async def __call__(self, scope, receive, send):
        if scope["type"] == "http" and _guarded(scope.get("path", "")) and not _logged_in(scope):
            body = json.dumps({"error": "Not authenticated"}).encode()
            await send({"type": "http.response.start", "status": 401,
                        "headers": [(b"content-type", b"application/json"),
                                    (b"content-length", str(len(body)).encode())]})
            await send({"type": "http.response.body", "body": body})
            return
        await self.app(scope, receive, send)


def _guarded(path: str) -> bool:
    path = "/" + path.lstrip("/")
    return any(path == prefix.rstrip("/") or path.startswith(prefix) for prefix in GUARDED_PREFIXES)


def _logged_in(scope) -> bool:
    """Gradio's own check (routes.py get_current_user): no auth configured, or a known token."""
    app = scope.get("app")
    if app is None or (getattr(app, "auth", None) is None and getattr(app, "auth_dependency", None) is None):
        return True
    cookies = HTTPConnection(scope).cookies
    cookie_id = getattr(app, "cookie_id", "")
    token = cookies.get(f"access-token-{cookie_id}") or cookies.get(f"access-token-unsecure-{cookie_id}")
    return getattr(app, "tokens", {}).get(token) is not None
