"""Jobs on a Ray cluster (jobs/train/cluster.py, ray_driver.py, ray_worker.py), on CPU: a local cluster of a
head and two three-CPU worker nodes (ray.cluster_utils.Cluster), jobs submitted by `python -m jobs.train`
through the Ray Jobs API and trained by Ray Train across two gloo workers (DDP, and FSDP2 with
`sharding: fsdp`).

Ray binds the machine's network address even when given 127.0.0.1, so the cluster and its jobs run
inside a network namespace of their own with only loopback up (`unshare -n`, as root, as CI runs):
no test traffic leaves the machine. Skipped without Ray (an optional extra: requirements-cluster.txt)
or without the rights to make that namespace. One cluster serves every test (module fixture)."""
import contextlib
import json
import os
import signal
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest
import yaml

from jobs.io.events import summarize
from jobs.train.checkpoints import latest_checkpoint
from tests.conftest import ROOT
from tests.jobs.train.job_runs import assert_same_training, write_config

pytest.importorskip("ray", reason="Ray is an optional extra: pip install -r requirements-cluster.txt")
pytestmark = pytest.mark.slow  # a cluster and four jobs: a minute or two alone, more on a loaded machine


def _namespace_problem() -> str | None:
    if os.geteuid() != 0 or not (shutil.which("unshare") and shutil.which("ip")):
        return "needs root, unshare and ip for a loopback-only network namespace"
    probe = subprocess.run(["unshare", "-n", "sh", "-c", "ip link set lo up"], capture_output=True, text=True)
    return None if probe.returncode == 0 else f"cannot make a network namespace: {probe.stderr.strip()}"


def _cli(config, *extra):
    return [sys.executable, "-m", "jobs.train", str(config), *map(str, extra)]


def _on_cluster(config, data_dir, *extra):
    return _cli(config, "--cluster", "{address}", "--workers", 2, "--gpus_per_worker", 0, "--data-dir", data_dir,
                *extra)


def _environment(tmp: Path, ray_tmp: str) -> dict:
    env = {k: v for k, v in os.environ.items() if not k.startswith("RAY_")}
    # HOME of its own: a local Ray writes ~/.ray/auth_token, which turns token auth on for later clusters
    env.update(HOME=str(tmp / "home"), RAY_TMPDIR=ray_tmp, OMP_NUM_THREADS="1", PYTHONUNBUFFERED="1",
               PATH=f"{Path(sys.executable).parent}{os.pathsep}{env.get('PATH', '')}",  # the jobs' `python`
               RAY_USAGE_STATS_ENABLED="0")
    return env


@pytest.fixture(scope="module")
def cluster_runs(tmp_path_factory, tiny_model):
    """Runs the jobs of every test on one local cluster; {name: {rc, output, acted}} and the folders."""
    problem = _namespace_problem()
    if problem:
        pytest.skip(problem)
    tmp = tmp_path_factory.mktemp("ray")
    data = tmp / "data"
    two = write_config(tmp, "two", tiny_model, max_steps=6)
    queued = yaml.safe_load(write_config(tmp, "queued", tiny_model, max_steps=100000, learning_rate=1e-3).read_text())
    killed = write_config(tmp, "killed", tiny_model, max_steps=100000, learning_rate=1e-3, save_steps=2)
    plan = {"results": str(tmp / "results.json"),
            "parallel": [_cli(two, "--output_dir", tmp / "one", "--batch_size", 4, "--data-dir", data)],
            "runs": [{"name": "two", "argv": _on_cluster(two, data), "job": str(tmp / "two"),
                      # FSDP2 between the same two workers, after the DDP job: its workers' CPUs are free again
                      "then": {"name": "fsdp", "argv": _on_cluster(two, data, "--output_dir", tmp / "fsdp",
                                                                   "--sharding", "fsdp")}},
                     {"name": "cancel", "config": {**queued, "output_dir": "", "workers": 2, "gpus_per_worker": 0},
                      "data_dir": str(tmp / "studio"), "stop_after_steps": 2},
                     {"name": "killed", "argv": _on_cluster(killed, data), "job": str(tmp / "killed"),
                      "kill_worker_after_steps": 3,
                      "then": {"name": "resumed", "argv": _cli(tmp / "killed" / "config.yaml", "--workers", 1,
                                                               "--resume_from", "{latest}",
                                                               "--max_steps", "{latest+2}", "--output_dir", tmp / "resumed",
                                                               "--data-dir", data)}}]}
    (tmp / "plan.json").write_text(json.dumps(plan))
    ray_tmp = tempfile.mkdtemp(prefix="ftr", dir="/tmp")  # short: Ray's socket paths must fit 107 bytes
    try:
        script = 'ip link set lo up && exec "$0" -m tests.jobs.train.ray_cluster_scenario "$1"'
        proc = subprocess.Popen(["unshare", "-n", "sh", "-c", script, sys.executable, str(tmp / "plan.json")],
                                cwd=ROOT, env=_environment(tmp, ray_tmp), stdout=subprocess.PIPE,
                                stderr=subprocess.STDOUT, text=True, start_new_session=True)
        try:
            output = proc.communicate(timeout=1200)[0]
        finally:  # a hung cluster: none of its processes outlives the test
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, signal.SIGKILL)
    finally:
        shutil.rmtree(ray_tmp, ignore_errors=True)
    assert proc.returncode == 0, output[-5000:]
    return json.loads((tmp / "results.json").read_text()), tmp


def test_a_job_on_two_ray_workers_trains_like_one_process(cluster_runs):
    """batch_size 2 on each of two workers (gloo) against one local process with batch 4: the same loss
    at every step and the same adapter, written into the job folder by rank 0."""
    results, tmp = cluster_runs
    two, one = results["two"], results["parallel-0"]
    assert one["rc"] == 0, one["output"]
    assert two["rc"] == 0, two["output"]
    run, _ = assert_same_training(tmp / "two", tmp / "one", 6)
    assert (run.start["processes"], run.start["global_batch"]) == (2, 4)
    records = [json.loads((tmp / "two" / "ray" / f"worker-{rank}.json").read_text()) for rank in (0, 1)]
    assert [r["code"] for r in records] == [0, 0] and records[0]["pid"] != records[1]["pid"]
    assert len({r["node_id"] for r in records}) == 2  # one worker on each node
    log = (tmp / "two" / "train.log").read_text()
    assert "submitted Ray job fusetune-two-" in log and "RayTrainWorker" in log and "\x1b[" not in log  # the workers' lines, without Ray's colours
    assert yaml.safe_load((tmp / "two" / "config.yaml").read_text())["workers"] == 2


def test_fsdp_between_two_ray_workers_trains_like_one_process(cluster_runs):
    """sharding fsdp on the same two gloo workers: FSDP2 over the process group Ray Train made, each worker
    holding half of every layer, gives the one process's losses and adapter (in the same PEFT files)."""
    results, tmp = cluster_runs
    fsdp = results["fsdp"]
    assert fsdp["rc"] == 0, fsdp["output"]
    run, _ = assert_same_training(tmp / "fsdp", tmp / "one", 6)
    assert any(line.startswith("sharding: fsdp over 2 processes") for line in run.start["patch_report"])
    assert (run.start["processes"], run.start["global_batch"]) == (2, 4)
    assert "FSDP2, the model sharded" in (tmp / "fsdp" / "train.log").read_text()
    assert sorted(p.name for p in (tmp / "fsdp" / "adapter").iterdir()) == \
        sorted(p.name for p in (tmp / "one" / "adapter").iterdir())
    records = [json.loads((tmp / "fsdp" / "ray" / f"worker-{rank}.json").read_text()) for rank in (0, 1)]
    assert [r["code"] for r in records] == [0, 0] and len({r["node_id"] for r in records}) == 2


def test_the_studio_queue_runs_a_cluster_job_and_its_cancel_keeps_a_checkpoint(cluster_runs):
    """A cluster job submitted to the studio's queue (Runner.submit) runs `python -m jobs.train` against
    the cluster with no local GPU given; Cancel (SIGTERM to it) makes the workers agree on a step, rank 0
    saves the checkpoint and the adapter, and the job ends `cancelled` like a local one."""
    results, _ = cluster_runs
    cancel = results["cancel"]
    assert cancel["acted"] is not None, cancel
    assert cancel["state"] == "cancelled" and "adapter saved" in cancel["reason"], cancel
    job = Path(cancel["job"])
    records = [json.loads((job / "ray" / f"worker-{rank}.json").read_text()) for rank in (0, 1)]
    assert [r["code"] for r in records] == [130, 130]
    summary = summarize(job)
    step = summary.steps[-1]["step"]
    assert step >= 2 and (job / "checkpoints" / f"step-{step}" / "optim.pt").is_file()
    assert (job / "adapter" / "adapter_model.safetensors").is_file()
    assert summary.final["type"] == "error" and summary.final["kind"] == "killed"
    config = yaml.safe_load((job / "config.yaml").read_text())
    assert (config["gpus"], config["processes"], config["workers"]) == ("auto", 0, 2)  # nothing placed here
    assert "stopping the Ray job" in (job / "train.log").read_text()


def test_a_worker_that_dies_fails_the_job_naming_it_and_its_node(cluster_runs):
    """SIGKILL to rank 1's Ray worker process: the job fails (exit 1), its last error names the worker,
    its pid and its node, and the last checkpoint is kept for a resume."""
    results, tmp = cluster_runs
    killed = results["killed"]
    assert killed["acted"] is not None, killed["output"]
    assert killed["rc"] == 1, killed["output"]
    job = tmp / "killed"
    record = json.loads((job / "ray" / "worker-1.json").read_text())
    assert "code" not in record and record["pid"] == killed["acted"]["pid"]
    final = summarize(job).final
    assert final["kind"] == "killed" and final["rank"] == 1, final
    assert final["message"].startswith(f"worker 1 (pid {record['pid']}) on node {record['host']} (127.0.0.1, Ray node "
                                       f"{record['node_id'][:12]}) died at step "), final["message"]
    assert "resume continues from it" in final["message"]
    assert (latest_checkpoint(job) / "optim.pt").is_file()
    assert final["message"] in (job / "train.log").read_text()


def test_the_killed_job_resumes_from_its_checkpoint_on_one_worker(cluster_runs):
    """The newest checkpoint the two workers left (step N, save_steps 2) continues on one worker, at N + 1."""
    results, tmp = cluster_runs
    resumed = results["resumed"]
    assert resumed["rc"] == 0, resumed["output"]
    summary = summarize(tmp / "resumed")
    at = int(latest_checkpoint(tmp / "killed").name.split("-")[1])
    assert at >= 2 and summary.start["resumed_at"] == at and summary.start["processes"] == 1
    assert [s["step"] for s in summary.steps] == [at + 1, at + 2] and summary.final["type"] == "done"
    assert "written by 2 process(es), this run has 1" in (tmp / "resumed" / "train.log").read_text()
