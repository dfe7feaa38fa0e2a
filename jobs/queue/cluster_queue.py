"""(jobs/queue) Where the queue places a job whose `cluster` key names a Ray cluster: on that cluster, by its
free resources, never on this machine's GPUs.

A cluster job starts (is submitted) once the cluster's alive nodes have `workers` CPUs and
`workers x gpus_per_worker` GPUs free (each Ray Train worker takes one CPU and its GPUs:
jobs/train/ray_driver.py); until then it waits in our queue, its reason saying what it waits for,
as a local job waits for GPUs. Submitting it at once would also work (Ray holds a job until its
workers fit), but the page would then say "running" for a job that waits, and a job of ours
queued behind it could not be cancelled or removed before it reaches the cluster.

The clusters are read (jobs/queue/cluster_resources.py) before the claim's transaction, never inside
it. Three cases start a job at once and let Ray's driver decide: the cluster did not say what is
free (no load report), the job is bigger than the whole cluster (the driver refuses it with
`cluster_too_small`), or the cluster was not read this pass. An unreachable cluster holds the job,
saying why; Cancel or Remove takes it out."""
from __future__ import annotations

import time
from typing import Any

from jobs.io.gpus import Placement, Wait
from jobs.messages import say
from jobs.queue.cluster_resources import CachedReader, ClusterReader, ClusterUnreachable, ClusterView, DashboardReader

# A cluster job we submitted this recently may not hold its workers in the cluster's load report yet
# (the driver starts, then asks for them): its need counts as taken, so one free GPU is not given twice.
SETTLE_S = 30.0
RESOURCES = (("gpus", "GPUs"), ("cpus", "CPUs"))


def demand(spec: dict[str, Any]) -> dict[str, int]:
    """What a cluster job's workers take: one CPU each, and gpus_per_worker GPUs each."""
    workers = int(spec.get("workers", 1) or 1)
    return {"cpus": workers, "gpus": workers * int(spec.get("gpus_per_worker", 1) or 0)}


class ClusterQueue:
    def __init__(self, reader: ClusterReader | None = None):
        self.reader: ClusterReader = reader or CachedReader(DashboardReader())
        self._seen: dict[str, ClusterView | str] = {}   # address -> the view, or why it could not be read

    def read(self, queued: list) -> None:
        """Read every cluster a queued job waits for (outside the claim's transaction: HTTP is slow)."""
        seen: dict[str, ClusterView | str] = {}
        for address in sorted({str(r.spec.get("cluster", "")).strip() for r in queued} - {""}):
            try:
                seen[address] = self.reader.read(address)
            except ClusterUnreachable as exc:
                seen[address] = str(exc)
        self._seen = seen

    def place(self, spec: dict[str, Any], running: list, now: float | None = None) -> Placement | Wait:
        """Start the job now (no GPU of this machine is given), or why it waits."""
        address = str(spec.get("cluster", "")).strip()
        view = self._seen.get(address)
        if view is None:
            return Placement(gpus=(), processes=1)
        if isinstance(view, str):
            return Wait(say("wait_cluster", problem=view))
        need, taken = demand(spec), self._settling(address, running, time.time() if now is None else now)
        for resource, name in RESOURCES:
            free, total = view.free(resource), int(view.total(resource))
            if not need[resource] or free is None or need[resource] > total:
                continue
            free_now = max(0, int(free) - taken[resource])
            if free_now < need[resource]:
                return Wait(say("wait_cluster_resources", address=address, need=need[resource], resource=name,
                                free=free_now, total=total))
        return Placement(gpus=(), processes=1)

    @staticmethod
    def _settling(address: str, running: list, now: float) -> dict[str, int]:
        taken = {"cpus": 0, "gpus": 0}
        for record in running:
            spec = record.spec or {}
            started = getattr(record, "started_at", None) or 0
            if str(spec.get("cluster", "")).strip() == address and now - started < SETTLE_S:
                for resource, amount in demand(spec).items():
                    taken[resource] += amount
        return taken
