"""(jobs/queue) A Ray cluster as the studio sees it: its nodes (alive or dead; CPUs, GPUs and memory, free
and in all) and its jobs, read from the cluster's dashboard over HTTP.

The same address a cluster job's `cluster` key holds (`http://head:8265`, what `ray job submit` takes)
serves Ray's documented REST endpoints, so this needs no Ray here (Ray is an optional extra) and no
connection to the cluster's GCS:

- `GET /api/v0/nodes?detail=1`: the State API's nodes (`ray list nodes`): id, IP, head or not, ALIVE or
  DEAD with why, and each node's total resources;
- `GET /api/cluster_status`: the autoscaler's load report, whose `usageByNode` holds [used, total] per
  resource and node (what `ray status` prints): total minus used is what a new job can get;
- `GET /api/jobs/`: the Jobs API's jobs (`ray job list`), with the `fusetune_job` metadata that
  jobs/train/cluster.py attaches: the job folder, where the job's files are.

A dashboard with token authentication (Ray >= 2.52, `RAY_AUTH_MODE=token`) gets the operator's token
as a bearer header (jobs/io/cluster_auth.py); its 401 or 403 is said as "needs a token: set ...".

`ClusterReader` is the small interface the queue (jobs/queue/cluster_queue.py) and the Jobs tab's
cluster panel read through, so that tests can hand in a fake; `CachedReader` keeps one reading per
address for a few seconds, however many pages and queue passes ask."""
from __future__ import annotations

import json
import threading
import time
import urllib.error
import urllib.request
from dataclasses import dataclass
from typing import Any, Callable, Protocol

from jobs.io.cluster_auth import auth_headers, token_refusal
from jobs.messages import say

TIMEOUT_S = 3.0     # a dashboard that does not answer in this long is reported as unreachable
CACHE_S = 5.0       # how long one reading of a cluster is reused
FAILED_CACHE_S = 30.0  # and a failure: a blackholed address costs whoever asks next a whole timeout
GIB = 1024 ** 3
NODES_PATH, STATUS_PATH, JOBS_PATH = "/api/v0/nodes?detail=1", "/api/cluster_status", "/api/jobs/"


@dataclass(frozen=True)
class Amount:
    """One resource of a node or the cluster: in all, and free (None: the cluster did not say)."""

    total: float
    free: float | None


@dataclass(frozen=True)
class ClusterNode:
    node_id: str
    name: str          # the node's name (its IP unless `ray start --node-name` gave one)
    ip: str
    head: bool
    alive: bool
    why_dead: str      # Ray's state message for a dead node ("health check failed ...")
    cpus: Amount
    gpus: Amount
    memory_gb: Amount  # Ray's logical `memory` resource, in GiB


@dataclass(frozen=True)
class ClusterJob:
    submission_id: str
    status: str        # PENDING, RUNNING, STOPPED, SUCCEEDED, FAILED
    job_folder: str    # where a Fusetune job's files are (its `fusetune_job` metadata); "" for others
    started_at: float | None
    message: str
    entrypoint: str


@dataclass(frozen=True)
class ClusterView:
    address: str
    nodes: tuple[ClusterNode, ...]
    jobs: tuple[ClusterJob, ...]

    def _amounts(self, resource: str) -> list[Amount]:
        return [getattr(node, resource) for node in self.nodes if node.alive]

    def total(self, resource: str) -> float:
        """`resource` ("cpus", "gpus", "memory_gb") over the alive nodes."""
        return sum(a.total for a in self._amounts(resource))

    def free(self, resource: str) -> float | None:
        """What the alive nodes have free of `resource`; None when any of them did not say."""
        amounts = self._amounts(resource)
        if any(a.free is None for a in amounts if a.total):
            return None
        return sum(a.free or 0.0 for a in amounts)


class ClusterUnreachable(Exception):
    """The dashboard did not answer, or not as a Ray dashboard does; the text is for people."""


class ClusterReader(Protocol):
    def read(self, address: str) -> ClusterView:
        """The cluster at `address` now; ClusterUnreachable says why not."""


class DashboardReader:
    """Reads a cluster through its dashboard's REST endpoints (urllib: no Ray needed here)."""

    def __init__(self, timeout_s: float = TIMEOUT_S,
                 fetch: Callable[[str, float], Any] | None = None):
        self.timeout_s = timeout_s
        self._fetch = fetch or _get_json

    def read(self, address: str) -> ClusterView:
        base = address.strip().rstrip("/")
        nodes = self._get(address, base + NODES_PATH)
        status = self._optional(base + STATUS_PATH)   # without it the nodes show, their free part unknown
        jobs = self._optional(base + JOBS_PATH)
        try:
            return ClusterView(address.strip(), parse_nodes(nodes, status), parse_jobs(jobs or []))
        except (KeyError, TypeError, ValueError, AttributeError) as exc:
            raise ClusterUnreachable(say("cluster_unreachable", address=address.strip(),
                                         detail=f"not a Ray dashboard's answer: {type(exc).__name__}: {exc}")) from None

    def _get(self, address: str, url: str) -> Any:
        try:
            return self._fetch(url, self.timeout_s)
        except urllib.error.HTTPError as exc:
            raise ClusterUnreachable(_refusal(address.strip(), exc)) from None
        except (OSError, ValueError) as exc:   # URLError, a timeout, a refused connection, not JSON
            raise ClusterUnreachable(say("cluster_unreachable", address=address.strip(), detail=_detail(exc))) from None

    def _optional(self, url: str) -> Any:
        try:
            return self._fetch(url, self.timeout_s)
        except (OSError, ValueError):
            return None


class CachedReader:
    """One reading (or one failure) per address, reused for `ttl_s` seconds: the queue reads every
    second and every open page asks, and a dashboard that is down must not cost each of them a timeout."""

    def __init__(self, reader: ClusterReader, ttl_s: float = CACHE_S, clock: Callable[[], float] = time.monotonic,
                 failed_ttl_s: float = FAILED_CACHE_S):
        self.reader, self.ttl_s, self.failed_ttl_s, self._clock = reader, ttl_s, failed_ttl_s, clock
        self._seen: dict[str, tuple[float, ClusterView | ClusterUnreachable]] = {}
        self._lock = threading.Lock()

    def read(self, address: str) -> ClusterView:
        with self._lock:
            seen = self._seen.get(address)
            ttl = self.failed_ttl_s if seen is not None and isinstance(seen[1], ClusterUnreachable) else self.ttl_s
            if seen is None or self._clock() - seen[0] > ttl:
                try:
                    result: ClusterView | ClusterUnreachable = self.reader.read(address)
                except ClusterUnreachable as exc:
                    result = exc
                seen = self._seen[address] = (self._clock(), result)
        if isinstance(seen[1], ClusterUnreachable):
            raise seen[1]
        return seen[1]

    def forget(self, address: str) -> None:
        """Read `address` afresh next time (the page's Refresh)."""
        with self._lock:
            self._seen.pop(address.strip(), None)
            self._seen.pop(address, None)


def parse_nodes(nodes: dict, status: dict | None) -> tuple[ClusterNode, ...]:
    """The State API's node list, with each node's free resources from the load report's usageByNode."""
    rows = nodes["data"]["result"]["result"]
    usage = _usage_by_node(status)
    out = []
    for row in rows:
        alive = row.get("state") == "ALIVE"
        total, used = row.get("resources_total") or {}, usage.get(row["node_id"]) if alive else None
        out.append(ClusterNode(
            node_id=row["node_id"], name=str(row.get("node_name") or row.get("node_ip") or ""),
            ip=str(row.get("node_ip") or ""), head=bool(row.get("is_head_node")), alive=alive,
            why_dead="" if alive else str(row.get("state_message") or ""),
            cpus=_amount(total, used, "CPU"), gpus=_amount(total, used, "GPU"),
            memory_gb=_amount(total, used, "memory", GIB)))
    out.sort(key=lambda n: (not n.head, not n.alive, n.name, n.node_id))
    return tuple(out)


def _usage_by_node(status: dict | None) -> dict[str, dict]:
    try:
        report = status["data"]["clusterStatus"]["loadMetricsReport"]
        return dict(report["usageByNode"] or {})
    except (KeyError, TypeError):
        return {}


def _amount(total: dict, used: dict | None, key: str, unit: float = 1.0) -> Amount:
    whole = float(total.get(key, 0.0)) / unit
    if used is None:
        return Amount(whole, None)
    pair = used.get(key)   # a node that never had the resource has no entry: nothing is free
    taken = float(pair[0]) / unit if pair else 0.0
    return Amount(whole, max(0.0, whole - taken))


def parse_jobs(jobs: list) -> tuple[ClusterJob, ...]:
    """The Jobs API's list, newest first."""
    out = []
    for row in jobs:
        metadata = row.get("metadata") or {}
        started = row.get("start_time")
        out.append(ClusterJob(
            submission_id=str(row.get("submission_id") or row.get("job_id") or ""), status=str(row.get("status", "")),
            job_folder=str(metadata.get("fusetune_job", "")),
            started_at=float(started) / 1000 if isinstance(started, (int, float)) and started else None,
            message=str(row.get("message") or "").strip().splitlines()[0][:300] if row.get("message") else "",
            entrypoint=str(row.get("entrypoint", ""))))
    out.sort(key=lambda j: -(j.started_at or 0))
    return tuple(out)


def _get_json(url: str, timeout_s: float) -> Any:
    request = urllib.request.Request(url, headers={"Accept": "application/json", **auth_headers(url)})
    with urllib.request.urlopen(request, timeout=timeout_s) as answer:   # noqa: S310 (the operator's address)
        return json.loads(answer.read().decode("utf-8"))


def _refusal(address: str, exc: urllib.error.HTTPError) -> str:
    """What a dashboard's HTTP error means for people: a token to set (401/403), else unreachable."""
    if exc.code in (401, 403):
        return token_refusal(address, _detail(exc))
    return say("cluster_unreachable", address=address, detail=_detail(exc))


def _detail(exc: BaseException) -> str:
    reason = getattr(exc, "reason", None)
    if isinstance(exc, urllib.error.HTTPError):
        return f"HTTP {exc.code} {exc.reason}"
    text = str(reason if reason is not None else exc).strip() or type(exc).__name__
    return text.splitlines()[0][:300]
