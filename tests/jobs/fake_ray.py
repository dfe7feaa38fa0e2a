"""A stand-in for a Ray cluster's dashboard: a tiny http.server thread that answers the REST endpoints the
studio reads (jobs/queue/cluster_resources.py) with JSON recorded from a real Ray 2.60 cluster.

The recordings (tests/jobs/queue/ray_api/) come from `ray start --head --num-cpus 2 --num-gpus 2` plus two
worker nodes (1 CPU and 1 GPU; 1 CPU) on one machine inside `unshare -n`, a submitted job holding 2 CPUs
and 2 GPUs (metadata `fusetune_job`), and the second worker's raylet killed: one node DEAD, 1 CPU and 1 GPU
free of 3 each. GPUs there are Ray's logical resources (`--num-gpus`), as on any GPU node.

With `token`, it demands that token as Ray's dashboard does under `RAY_AUTH_MODE=token`
(ray/_private/authentication/http_token_authentication.py): 401 without an Authorization header, 403
with a wrong one; `seen` collects (method, path, Authorization header) of every request."""
from __future__ import annotations

import contextlib
import json
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

RECORDED = Path(__file__).parent / "queue" / "ray_api"
PATHS = {"/api/v0/nodes?detail=1": "nodes.json", "/api/cluster_status": "cluster_status.json", "/api/jobs/": "jobs.json"}


def recorded() -> dict[str, object]:
    """Request path -> the recorded answer."""
    return {path: json.loads((RECORDED / name).read_text()) for path, name in PATHS.items()}


@contextlib.contextmanager
def dashboard(answers: dict[str, object] | None = None, token: str | None = None, seen: list | None = None):
    """Serve `answers` (path -> JSON; default: the recordings) on 127.0.0.1, to GET and POST; yields the
    address, http://127.0.0.1:PORT, and the list of paths asked, in order."""
    answers = recorded() if answers is None else answers
    asked: list[str] = []

    class Handler(BaseHTTPRequestHandler):
        def do_GET(self) -> None:   # noqa: N802 (http.server's name)
            asked.append(self.path)
            self.rfile.read(int(self.headers.get("Content-Length") or 0))   # a POST's body, unread otherwise
            given = self.headers.get("Authorization")
            if seen is not None:
                seen.append((self.command, self.path, given))
            if token is not None and given != f"Bearer {token}":   # Ray's own answers
                self._send(*((403, "Forbidden: Invalid authentication token") if given else
                             (401, "Unauthorized: Missing authentication token")))
                return
            if self.path not in answers:
                self.send_error(404)
                return
            self._send(200, json.dumps(answers[self.path]), "application/json")

        def _send(self, code: int, text: str, kind: str = "text/plain") -> None:
            body = text.encode()
            self.send_response(code)
            self.send_header("Content-Type", kind)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        do_POST = do_GET   # noqa: N815 (the Jobs API's stop)

        def log_message(self, *args) -> None:
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}", asked
    finally:
        server.shutdown()
        server.server_close()
        thread.join(timeout=5)
