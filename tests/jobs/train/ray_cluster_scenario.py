"""`python -m tests.jobs.train.ray_cluster_scenario PLAN.json`: start a local Ray cluster (a head and two
three-CPU worker nodes, Ray's own `ray.cluster_utils.Cluster`) and run the plan's commands against it (at
once), writing each one's exit code and output to the plan's `results` file.

test_ray_cluster.py runs this inside a network namespace with only loopback up, so that Ray (which
binds the machine's network address even when told 127.0.0.1) sends nothing beyond this machine.
A plan: {"results": path, "runs": [{"name", "argv", "stop_after_steps": N (SIGTERM once the job
folder `job` has N steps), "kill_worker_after_steps": N (SIGKILL rank 1's worker), "then": a run after it}, or {"name",
"config", "data_dir", "stop_after_steps"}: a job through the studio's queue, cancelled there],
"parallel": [argv run while the cluster starts]}; "{address}" in an argv is the cluster's address. In a
"then" run's argv, "{latest}" is the newest checkpoint the run before it left and "{latest+2}" its step
plus two: how far a worker got before its kill depends on the machine's load, and only the newest two
checkpoints are kept."""
from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

from tests.conftest import ROOT

DASHBOARD_PORT = 8265  # a namespace of its own: every port is free


def start_cluster(attempts: int = 3):
    """A head (it runs the Ray jobs' drivers: no CPU asked) and two worker nodes; each job's workers are
    spread over the two. Returns the cluster and its dashboard's address. Tried up to three times: a
    raylet must register within Ray's fixed 30 s, which a loaded CI machine can miss; each try takes
    other ports, since a failed try's dashboard may still hold its port while it exits (seen at load 20
    on 2 cores: "Failed to bind to 127.0.0.1:8265 because it's already occupied")."""
    from ray.cluster_utils import Cluster
    for attempt in range(attempts):
        cluster, shift = Cluster(), 10 * attempt
        try:
            cluster.add_node(num_cpus=0, include_dashboard=True, dashboard_port=DASHBOARD_PORT + shift,
                             dashboard_agent_listen_port=52365 + shift)
            for index in range(2):  # each node on one machine needs its own agent port
                cluster.add_node(num_cpus=3, dashboard_agent_listen_port=52366 + shift + index)
            cluster.wait_for_nodes()
            return cluster, f"http://127.0.0.1:{DASHBOARD_PORT + shift}"
        except Exception:
            cluster.shutdown()
            if attempt == attempts - 1:
                raise


def _steps(job: str) -> int:
    from jobs.io.events import summarize
    return len(summarize(job).steps) if Path(job, "events.jsonl").is_file() else 0


def _worker_pid(job: str, rank: int) -> int | None:
    try:
        return json.loads(Path(job, "ray", f"worker-{rank}.json").read_text())["pid"]
    except (OSError, ValueError, KeyError):
        return None


def _after(then: dict, job: str) -> dict:
    """`then` with "{latest}" and "{latest+2}" filled in from the checkpoints of `job`."""
    from jobs.train.checkpoints import latest_checkpoint
    latest = latest_checkpoint(Path(job))
    step = int(latest.name.split("-", 1)[1]) if latest else 0
    fill = {"{latest}": str(latest), "{latest+2}": str(step + 2)}
    return {**then, "argv": [fill.get(a, a) for a in then["argv"]]}


def run(spec: dict, address: str) -> dict:
    argv = [a.replace("{address}", address) for a in spec["argv"]]
    began = time.monotonic()
    proc = subprocess.Popen(argv, cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    acted = None
    for key, sig in (("stop_after_steps", signal.SIGTERM), ("kill_worker_after_steps", signal.SIGKILL)):
        if key not in spec:
            continue
        while proc.poll() is None and _steps(spec["job"]) < spec[key]:
            time.sleep(0.2)
        if proc.poll() is None:
            pid = proc.pid if sig == signal.SIGTERM else _worker_pid(spec["job"], 1)
            os.kill(pid, sig)
            acted = {"pid": pid, "at_step": _steps(spec["job"])}
    output = proc.communicate(timeout=900)[0]
    return {"rc": proc.returncode, "output": output[-6000:], "acted": acted, "seconds": time.monotonic() - began}


def run_queued(spec: dict, address: str) -> dict:
    """A job through the studio's queue (jobs/queue/runner.py), cancelled there once it has
    `stop_after_steps` steps: what the Jobs tab's Cancel does."""
    from jobs.queue.runner import Runner
    from jobs.spec import JobSpec
    runner = Runner(spec["data_dir"])
    record = runner.submit(JobSpec.from_dict({**spec["config"], "cluster": address}))
    deadline = time.monotonic() + 900
    while not runner.get(record.id).finished and _steps(record.job_dir) < spec["stop_after_steps"]:
        assert time.monotonic() < deadline, "the queued job never trained"
        time.sleep(0.2)
    acted = {"at_step": _steps(record.job_dir)} if runner.cancel(record.id) else None
    while not (final := runner.get(record.id)).finished:
        assert time.monotonic() < deadline, "the cancelled job never ended"
        time.sleep(0.5)
    return {"state": final.state.value, "reason": final.reason, "job": str(record.job_dir), "acted": acted}


def main(plan_path: str) -> None:
    plan = json.loads(Path(plan_path).read_text())
    parallel = [subprocess.Popen(argv, cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
                for argv in plan.get("parallel", [])]
    began = time.monotonic()
    cluster, address = start_cluster()
    results: dict = {"cluster": {"seconds": time.monotonic() - began}}
    try:
        def one(spec: dict) -> None:
            results[spec["name"]] = (run_queued if "config" in spec else run)(spec, address)
            if "then" in spec:  # a run that needs this one's folder (a resume)
                one(_after(spec["then"], spec["job"]))
        threads = [threading.Thread(target=one, args=(spec,)) for spec in plan["runs"]]   # at once: each node has a CPU for each job's worker
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
    finally:
        cluster.shutdown()
        for index, proc in enumerate(parallel):
            output = proc.communicate(timeout=300)[0]
            results[f"parallel-{index}"] = {"rc": proc.returncode, "output": output[-6000:],
                                            "seconds": time.monotonic() - began}
        Path(plan["results"]).write_text(json.dumps(results))


if __name__ == "__main__":
    main(sys.argv[1])
