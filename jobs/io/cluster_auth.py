"""(jobs/io) The token a Ray cluster's dashboard may demand, for the studio's reads of it
(jobs/queue/cluster_resources.py) and the Jobs API's submit, status, logs and stop (jobs/train/cluster.py).

Ray >= 2.52 has token authentication (`RAY_AUTH_MODE=token` on every node, and planned to become the
default): the dashboard then answers 401 to a request without `Authorization: Bearer <token>` and 403 to
a wrong token (ray/_private/authentication/http_token_authentication.py). Ray's own clients send the
token only under RAY_AUTH_MODE=token, taking it from RAY_AUTH_TOKEN, else the file RAY_AUTH_TOKEN_PATH
names, else ~/.ray/auth_token (docs.ray.io "Ray token authentication"); we do the same, and first take
the operator's FUSETUNE_CLUSTER_TOKEN, which needs no Ray setting where the studio runs.

The token lives in the environment or Ray's file only: never in a JobSpec (whose config.yaml lands in the
job folder), an event or a log line; messages name where it came from, never the token. A studio started
with a cluster (`--cluster` / FUSETUNE_CLUSTER, which app.py leaves in the environment for its jobs) sends
it to that cluster's dashboard only: the Jobs tab's panel takes any address a page user types, and a
token sent there would be theirs."""
from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path
from urllib.parse import urlsplit

from jobs.messages import say

TOKEN_ENV = "FUSETUNE_CLUSTER_TOKEN"
RAY_FILE = Path(".ray", "auth_token")   # under HOME: where `ray get-auth-token --generate` and a local ray.init write it


@dataclass(frozen=True)
class ClusterToken:
    value: str
    source: str   # where it came from, for messages: "FUSETUNE_CLUSTER_TOKEN", "RAY_AUTH_TOKEN", a file


def cluster_token(environ: dict | None = None) -> ClusterToken | None:
    """The token to send to a Ray dashboard, or None (send none). Read at each use: a token file the
    operator writes later is picked up without restarting the studio."""
    env = os.environ if environ is None else environ
    for name in (TOKEN_ENV,) + (("RAY_AUTH_TOKEN",) if env.get("RAY_AUTH_MODE") == "token" else ()):
        if env.get(name, "").strip():
            return ClusterToken(env[name].strip(), name)
    if env.get("RAY_AUTH_MODE") != "token":
        return None
    home = env.get("HOME") or str(Path.home())
    path = Path(env["RAY_AUTH_TOKEN_PATH"]).expanduser() if env.get("RAY_AUTH_TOKEN_PATH") else Path(home) / RAY_FILE
    try:
        value = path.read_text(encoding="utf-8").strip()
    except OSError:
        return None
    return ClusterToken(value, str(path)) if value else None


def _origin(address: str) -> tuple:
    parts = urlsplit(address.strip())
    return parts.scheme, (parts.hostname or "").lower(), parts.port or (443 if parts.scheme == "https" else 80)


def goes_to(address: str, environ: dict | None = None) -> bool:
    """Whether a token may be sent to the dashboard at `address`: any, unless the studio names its
    cluster (FUSETUNE_CLUSTER): then that one's scheme, host and port only."""
    env = os.environ if environ is None else environ
    home = env.get("FUSETUNE_CLUSTER", "").strip()
    return not home or _origin(home) == _origin(address)


def auth_headers(address: str, environ: dict | None = None) -> dict[str, str]:
    """{"Authorization": "Bearer <token>"} for the dashboard at `address` when there is a token for it, else {}."""
    token = cluster_token(environ)
    return {"Authorization": f"Bearer {token.value}"} if token and goes_to(address, environ) else {}


def token_source(environ: dict | None = None) -> str:
    """Where the token came from, or "" when there is none (for the 401/403 messages)."""
    token = cluster_token(environ)
    return token.source if token else ""


def token_refusal(address: str, detail: str, environ: dict | None = None) -> str:
    """What a dashboard's 401 (no token) or 403 (a wrong one) means for people: the setting to make."""
    env = os.environ if environ is None else environ
    source = token_source(env)
    if source and not goes_to(address, env):
        return say("cluster_token_elsewhere", address=address, cluster=env["FUSETUNE_CLUSTER"].strip(), detail=detail)
    if source:
        return say("cluster_token_refused", address=address, source=source, detail=detail)
    return say("cluster_needs_token", address=address, detail=detail)
