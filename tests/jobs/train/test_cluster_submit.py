"""The cluster keys (cluster, workers, gpus_per_worker) and what happens before a job reaches a Ray cluster:
refusals with a reason, no Ray needed to validate, and the queue placing nothing of this machine.
Seconds each; the jobs on a real local cluster are in test_ray_cluster.py."""
import contextlib
import sys

import pytest
import yaml

from jobs.io import gpus
from jobs.io.events import summarize
from jobs.spec import JobSpec, SpecError
from jobs.train import cli
from tests.jobs.fake_ray import dashboard

with contextlib.suppress(ImportError):  # imported before the CLI's log tee: Ray's colorama keeps the stream it saw
    import ray.job_submission  # noqa: F401


@pytest.mark.parametrize("data, key, words", [
    ({"workers": 2}, "workers", "set cluster to its dashboard address"),
    ({"cluster": "head-node:8265"}, "cluster", "give one like http://head-node:8265"),
    ({"cluster": "ray://head:10001"}, "cluster", "is not a Ray dashboard address"),
    ({"cluster": "http://head:8265", "processes": 2}, "processes", "Ray places the job: leave it at 0"),
    ({"cluster": "http://head:8265", "gpus": "0,1"}, "gpus", "leave it at auto"),
    ({"cluster": "http://head:8265", "gpus_per_worker": 2}, "gpus_per_worker", "above the maximum 1"),
])
def test_cluster_keys_are_refused_with_a_reason(data, key, words):
    with pytest.raises(SpecError) as refused:
        JobSpec.from_dict(data)
    assert refused.value.key == key and words in str(refused.value), str(refused.value)


def test_a_dashboard_address_is_accepted_and_batch_size_stays_per_worker():
    spec = JobSpec.from_dict({"cluster": " http://10.0.0.5:8265 ", "workers": 4, "gpus_per_worker": 0})
    assert (spec.cluster, spec.workers, spec.gpus_per_worker, spec.batch_size) == ("http://10.0.0.5:8265", 4, 0, 4)
    assert JobSpec.from_dict({"cluster": "https://ray.example.org/"}).cluster == "https://ray.example.org/"


def _config(tmp_path, **keys):
    path = tmp_path / "job.yaml"
    path.write_text(yaml.safe_dump({"output_dir": str(tmp_path / "job"), **keys}))
    return path


def test_without_ray_the_cli_says_how_to_install_it(tmp_path, monkeypatch, capsys, in_process_cli):
    monkeypatch.setitem(sys.modules, "ray.job_submission", None)  # as if Ray were not installed
    code = cli.main([str(_config(tmp_path, cluster="http://127.0.0.1:9")), "--data-dir", str(tmp_path / "data")])
    assert code == 2
    assert "pip install -r requirements-cluster.txt" in capsys.readouterr().err
    assert summarize(tmp_path / "job").final["kind"] == "config"


def test_an_unreachable_cluster_fails_at_once_naming_the_address(tmp_path, capsys, in_process_cli):
    pytest.importorskip("ray", reason="Ray is an optional extra: pip install -r requirements-cluster.txt")
    address = "http://127.0.0.1:9"  # loopback, a closed port: nothing leaves the machine
    code = cli.main([str(_config(tmp_path, cluster=address)), "--data-dir", str(tmp_path / "data")])
    err = capsys.readouterr().err.strip().splitlines()
    assert code == 1 and err[-1].startswith(f"fusetune: cannot reach the Ray cluster at {address} ("), err
    final = summarize(tmp_path / "job").final
    assert final["kind"] == "config" and "ray start --head" in final["message"]
    assert "cannot reach the Ray cluster" in (tmp_path / "job" / "train.log").read_text()


TOKEN = "s3cret-token"
VERSION = {"/api/version": {"version": "4", "ray_version": "2.60.0", "ray_commit": "0" * 40, "session_name": "s"}}


def _token_env(monkeypatch, value=None):
    for name in ("FUSETUNE_CLUSTER_TOKEN", "RAY_AUTH_MODE", "RAY_AUTH_TOKEN", "RAY_AUTH_TOKEN_PATH"):
        monkeypatch.delenv(name, raising=False)
    if value is not None:
        monkeypatch.setenv("FUSETUNE_CLUSTER_TOKEN", value)


def test_the_jobs_api_client_sends_the_operators_token_on_every_request(monkeypatch):
    """A dashboard under Ray's token auth (a stand-in demanding the bearer token): the Jobs API client of a
    cluster job sends FUSETUNE_CLUSTER_TOKEN on the version check, a stop and a logs read (and, by the
    same headers, on submit, status and the log tail)."""
    pytest.importorskip("ray", reason="Ray is an optional extra: pip install -r requirements-cluster.txt")
    from jobs.train.cluster import connect
    _token_env(monkeypatch, TOKEN)
    answers = {**VERSION, "/api/jobs/fusetune-x/stop": {"stopped": True}, "/api/jobs/fusetune-x/logs": {"logs": "step 1\n"}}
    seen = []
    with dashboard(answers, token=TOKEN, seen=seen) as (address, _):
        client = connect(address)
        assert client.stop_job("fusetune-x") is True and client.get_job_logs("fusetune-x") == "step 1\n"
    assert {(method, path) for method, path, _ in seen} == {
        ("GET", "/api/version"), ("POST", "/api/jobs/fusetune-x/stop"), ("GET", "/api/jobs/fusetune-x/logs")}
    assert {header for *_, header in seen} == {f"Bearer {TOKEN}"}


@pytest.mark.parametrize("given, words", [
    (None, "needs a token (AuthenticationError: Authentication required: Unauthorized: Missing authentication "
           "token): set FUSETUNE_CLUSTER_TOKEN to the cluster's token"),
    ("wrong-token", "refused the token from FUSETUNE_CLUSTER_TOKEN (AuthenticationError: Authentication failed: "
                    "Forbidden: Invalid authentication token)")])
def test_a_cluster_that_demands_a_token_refuses_the_job_saying_what_to_set(tmp_path, capsys, in_process_cli,
                                                                             monkeypatch, given, words):
    """Without the token (or with a wrong one) the job fails at once with one line saying what to set; the
    token is never written into the job folder."""
    pytest.importorskip("ray", reason="Ray is an optional extra: pip install -r requirements-cluster.txt")
    _token_env(monkeypatch, given)
    with dashboard(VERSION, token=TOKEN) as (address, _):
        code = cli.main([str(_config(tmp_path, cluster=address)), "--data-dir", str(tmp_path / "data")])
    err = capsys.readouterr().err.strip().splitlines()
    assert code == 1 and err[-1].startswith(f"fusetune: the Ray cluster at {address} {words}"), err
    final = summarize(tmp_path / "job").final
    assert final["kind"] == "config" and words in final["message"]
    written = "".join(p.read_text(errors="replace") for p in (tmp_path / "job").rglob("*") if p.is_file())
    assert "token" in written and "wrong-token" not in written and TOKEN not in written


def test_the_queue_places_a_cluster_job_on_no_gpu_of_this_machine(tmp_path):
    """A running cluster job holds no local GPU, and does not count against the local jobs that may run."""
    from types import SimpleNamespace

    from jobs.queue.runner import Runner
    job = tmp_path / "job"
    job.mkdir()
    (job / "config.yaml").write_text(yaml.safe_dump({"cluster": "http://head:8265", "gpus": "auto"}))
    assert gpus.held_by_jobs([SimpleNamespace(job_dir=str(job), name="on the cluster")]) == {}
    runner = Runner(tmp_path / "data", max_running=1)
    running = [SimpleNamespace(id="a", spec={"cluster": "http://head:8265"}, job_dir=str(job), name="a")]
    queued = [SimpleNamespace(id="b", spec={"gpus": "auto", "processes": 0}, job_dir=str(tmp_path / "b"), reason="",
                              name="b")]
    if not gpus.read_gpus():  # on a machine without GPUs the local limit is max_running
        assert runner._choose(running, queued) == "b"
    queued[0].spec = {"cluster": "http://head:8265"}
    assert runner._choose([], queued) == "b" and runner._placements["b"].gpus == ()
