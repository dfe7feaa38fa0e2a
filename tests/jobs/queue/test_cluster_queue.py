"""A Ray cluster as the queue sees it (jobs/queue/cluster_resources.py, cluster_queue.py): read from a stand-in
dashboard that answers with recorded Ray JSON, and a job with `cluster` set waiting for the cluster's free
GPUs and CPUs (never this machine's). No Ray here: seconds in all."""
import time
from pathlib import Path
from types import SimpleNamespace

import pytest

from jobs.io.gpus import Placement, Wait
from jobs.queue.cluster_queue import SETTLE_S, ClusterQueue
from jobs.queue.cluster_resources import (Amount, CachedReader, ClusterNode, ClusterUnreachable, ClusterView,
                                          DashboardReader)
from jobs.queue.runner import Runner
from jobs.queue.store import JobState
from jobs.spec import JobSpec
from tests.jobs.fake_ray import dashboard, recorded
from tests.jobs.fakes import write_fake_trainer

HEAD = "http://head:8265"


def test_the_dashboard_reading_lists_nodes_free_resources_and_our_jobs():
    with dashboard() as (address, asked):
        view = DashboardReader().read(address + "/")
    assert asked == ["/api/v0/nodes?detail=1", "/api/cluster_status", "/api/jobs/"]
    head, worker, dead = view.nodes
    assert (head.head, head.alive, head.cpus, head.gpus) == (True, True, Amount(2, 1), Amount(2, 1))
    assert (worker.alive, worker.cpus, worker.gpus) == (True, Amount(1, 0), Amount(1, 0))
    assert not dead.alive and "health check failed" in dead.why_dead and dead.cpus.free is None
    assert round(head.memory_gb.total, 2) == 8.96 and head.memory_gb.free == head.memory_gb.total
    assert (view.total("gpus"), view.free("gpus"), view.total("cpus"), view.free("cpus")) == (3, 1, 3, 1)
    (job,) = view.jobs
    assert (job.submission_id, job.status, job.job_folder) == (
        "fusetune-20261204-demo-a1b2c3", "RUNNING", "/shared/fusetune/jobs/20261204-demo")


def test_a_cluster_without_a_load_report_shows_its_nodes_with_the_free_part_unknown():
    answers = recorded()
    del answers["/api/cluster_status"]
    with dashboard(answers) as (address, _):
        view = DashboardReader().read(address)
    assert len(view.nodes) == 3 and view.total("gpus") == 3 and view.free("gpus") is None


def test_an_unreachable_cluster_is_named_with_the_reason():
    with dashboard({}) as (address, _):   # answers 404 to everything: not a Ray dashboard
        try:
            DashboardReader().read(address)
        except ClusterUnreachable as exc:
            assert str(exc).startswith(f"cannot reach the Ray cluster at {address} (HTTP 404")
        else:
            raise AssertionError("a dashboard answering 404 was read")
    try:
        DashboardReader(timeout_s=1).read(address)   # nobody listens there any more
    except ClusterUnreachable as exc:
        assert "Connection refused" in str(exc) and "ray start --head" in str(exc)
    else:
        raise AssertionError("a closed port was read")


def _no_token(monkeypatch):
    for name in ("FUSETUNE_CLUSTER_TOKEN", "RAY_AUTH_MODE", "RAY_AUTH_TOKEN", "RAY_AUTH_TOKEN_PATH"):
        monkeypatch.delenv(name, raising=False)


def test_a_dashboard_with_token_auth_is_read_with_the_operators_token_and_refusals_say_what_to_set(monkeypatch):
    """Ray's token auth (RAY_AUTH_MODE=token): without a token the dashboard answers 401 and the reading says
    the cluster needs one and where to set it; with FUSETUNE_CLUSTER_TOKEN every endpoint gets it as a bearer
    header; a wrong one (403) is named by where it came from, never shown."""
    _no_token(monkeypatch)
    seen = []
    with dashboard(token="s3cret-token", seen=seen) as (address, _):
        with pytest.raises(ClusterUnreachable) as refused:
            DashboardReader().read(address)
        assert str(refused.value).startswith(f"the Ray cluster at {address} needs a token (HTTP 401 Unauthorized): "
                                             "set FUSETUNE_CLUSTER_TOKEN to the cluster's token")
        monkeypatch.setenv("FUSETUNE_CLUSTER_TOKEN", "wrong")
        with pytest.raises(ClusterUnreachable) as refused:
            DashboardReader().read(address)
        assert "refused the token from FUSETUNE_CLUSTER_TOKEN (HTTP 403 Forbidden)" in str(refused.value)
        assert "wrong" not in str(refused.value)
        monkeypatch.setenv("FUSETUNE_CLUSTER_TOKEN", "s3cret-token")
        seen.clear()
        view = DashboardReader().read(address)
    assert len(view.nodes) == 3 and view.jobs[0].status == "RUNNING"
    assert seen == [("GET", path, "Bearer s3cret-token") for path in ("/api/v0/nodes?detail=1", "/api/cluster_status",
                                                                      "/api/jobs/")]


class FakeReader:
    """A cluster of `gpus` GPUs and `cpus` CPUs, `free_gpus` / `free_cpus` of them free; None: down."""

    def __init__(self, gpus=4, cpus=8, free_gpus=4, free_cpus=8):
        self.gpus, self.cpus, self.free_gpus, self.free_cpus, self.reads = gpus, cpus, free_gpus, free_cpus, 0

    def read(self, address):
        self.reads += 1
        if self.gpus is None:
            raise ClusterUnreachable(f"cannot reach the Ray cluster at {address} (Connection refused): ...")
        node = ClusterNode("n1", "10.0.0.2", "10.0.0.2", True, True, "", Amount(self.cpus, self.free_cpus),
                           Amount(self.gpus, self.free_gpus), Amount(64, 64))
        return ClusterView(address, (node,), ())


def queued(**spec):
    return SimpleNamespace(spec={"cluster": HEAD, **spec})


def test_a_cluster_job_waits_for_its_workers_gpus_and_says_what_is_free():
    reader = FakeReader(free_gpus=1)
    clusters = ClusterQueue(reader)
    job = {"cluster": HEAD, "workers": 2, "gpus_per_worker": 1}
    clusters.read([queued(**job)])
    decision = clusters.place(job, running=[])
    assert isinstance(decision, Wait)
    assert decision.reason == f"waiting for the Ray cluster at {HEAD}: the job needs 2 GPUs free, 1 of its 4 are"
    reader.free_gpus = 2
    clusters.read([queued(**job)])
    assert clusters.place(job, running=[]) == Placement(gpus=(), processes=1)


def test_cpu_workers_wait_for_cpus_and_a_just_started_job_counts_as_taken():
    reader = FakeReader(gpus=0, free_gpus=0, cpus=4, free_cpus=4)
    clusters = ClusterQueue(reader)
    job = {"cluster": HEAD, "workers": 3, "gpus_per_worker": 0}
    clusters.read([queued(**job)])
    assert isinstance(clusters.place(job, running=[]), Placement)
    # the first one was submitted a moment ago: Ray's report does not show its workers yet
    now = time.time()
    started = SimpleNamespace(spec=dict(job), started_at=now - 2)
    waiting = clusters.place(job, running=[started], now=now)
    assert isinstance(waiting, Wait) and "needs 3 CPUs free, 1 of its 4 are" in waiting.reason
    assert isinstance(clusters.place(job, running=[started], now=now + SETTLE_S), Placement)


def test_unknown_usage_or_a_job_bigger_than_the_cluster_goes_to_ray_which_decides():
    clusters = ClusterQueue(FakeReader(gpus=2, free_gpus=0))
    too_big = {"cluster": HEAD, "workers": 4, "gpus_per_worker": 1}
    clusters.read([queued(**too_big)])
    assert isinstance(clusters.place(too_big, running=[]), Placement)   # the driver refuses it, saying why


def test_an_unreachable_cluster_holds_the_job_saying_why():
    clusters = ClusterQueue(FakeReader(gpus=None))
    clusters.read([queued()])
    decision = clusters.place({"cluster": HEAD}, running=[])
    assert isinstance(decision, Wait)
    assert decision.reason.startswith(f"waiting for the Ray cluster: cannot reach the Ray cluster at {HEAD}")


def test_readings_are_shared_for_a_few_seconds_failures_too():
    clock = [0.0]
    reader = FakeReader(gpus=None)
    cached = CachedReader(reader, ttl_s=5, clock=lambda: clock[0], failed_ttl_s=20)
    for _ in range(3):
        try:
            cached.read(HEAD)
        except ClusterUnreachable:
            pass
    assert reader.reads == 1
    reader.gpus = 4
    clock[0] = 6.0   # a failure is kept longer than a reading
    try:
        cached.read(HEAD)
    except ClusterUnreachable:
        pass
    clock[0] = 21.0
    assert cached.read(HEAD).total("gpus") == 4 and reader.reads == 2
    clock[0] = 25.0
    assert cached.read(HEAD).total("gpus") == 4 and reader.reads == 2
    clock[0] = 27.0
    cached.read(HEAD)
    assert reader.reads == 3
    cached.forget(HEAD)   # the page's Refresh
    cached.read(HEAD)
    assert reader.reads == 4


def test_the_runner_queues_a_cluster_job_until_the_cluster_has_room_and_local_jobs_pass_it(tmp_path):
    runner = Runner(tmp_path / "data", python=str(write_fake_trainer(tmp_path)))
    reader = FakeReader(free_gpus=1)
    runner.clusters = ClusterQueue(reader)
    cluster_job = runner.submit(JobSpec(name="big", cluster=HEAD, workers=2, gpus_per_worker=1))
    local_job = runner.submit(JobSpec(name="local"))
    record = runner.get(cluster_job.id)
    assert record.state == JobState.QUEUED
    assert record.reason == f"waiting for the Ray cluster at {HEAD}: the job needs 2 GPUs free, 1 of its 4 are"
    assert runner.get(local_job.id).state in (JobState.RUNNING, JobState.DONE)   # not held up behind it
    reader.free_gpus = 3
    deadline = time.time() + 30
    while runner.get(cluster_job.id).state == JobState.QUEUED and time.time() < deadline:
        time.sleep(0.1)
    record = runner.get(cluster_job.id)
    assert record.state in (JobState.RUNNING, JobState.DONE) and record.reason == ""
    assert "gpus: auto" in (Path(record.job_dir) / "config.yaml").read_text()   # no GPU of this machine
