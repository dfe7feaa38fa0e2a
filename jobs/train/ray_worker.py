"""One Ray Train worker of a cluster job (jobs/train/ray_driver.py starts them through `TorchTrainer`).

Ray Train sets the same environment torchrun gives a rank (RANK, WORLD_SIZE, LOCAL_RANK,
LOCAL_WORLD_SIZE, MASTER_ADDR/PORT) and has already joined the process group (gloo on CPUs, NCCL
on GPUs), so the worker runs the very rank a local data-parallel job runs (`cli._run`, with
jobs/train/distributed.py's DDP, or FSDP2 with `sharding: fsdp`: jobs/train/sharding.py's
`init_device_mesh` lays its one-dimensional mesh over the world group Ray made, so nothing differs
here); rank 0 writes the events, checkpoints and adapter into the job folder, which every node sees
at the same path.

Each worker records in the folder's ray/ where it runs (node, pid) and how it ended, so that the
driver can name the worker and node of a failure. A worker cannot be sent a signal (it trains in a
thread of a Ray actor), so a cancel reaches it as the stop request file it watches."""
from __future__ import annotations

import json
import os
import socket
import sys
import threading
import time

from jobs.io.layout import JobLayout
from jobs.io.storage import StorageError, write_private_text
from jobs.train import cli

EXIT_CANCELLED = 130
STOP_POLL_S = 0.5


class WorkerFailed(RuntimeError):
    """A rank's trainer failed (its error event is written): raised so that Ray ends the others now."""


def record_path(layout: JobLayout, rank: int):
    return layout.ray / f"worker-{rank}.json"


def read_records(layout: JobLayout) -> dict[int, dict]:
    """{rank: record} of the workers that have started."""
    records = {}
    for path in sorted(layout.ray.glob("worker-*.json")):
        try:
            record = json.loads(path.read_text(encoding="utf-8"))
            records[int(record["rank"])] = record
        except (OSError, ValueError, KeyError, TypeError):
            continue
    return records


def _where() -> dict:
    import ray
    return {"pid": os.getpid(), "host": socket.gethostname(), "node_ip": ray.util.get_node_ip_address(),
            "node_id": ray.get_runtime_context().get_node_id()}


def train_worker(config: dict) -> None:
    """Ray Train's train_loop_per_worker: `config["argv"]` is the driver's command line (the job's
    config.yaml and --data-dir)."""
    spec, data_dir = cli.parse(config["argv"])
    layout = JobLayout(spec.output_dir)
    rank = int(os.environ["RANK"])
    record = {"rank": rank, **_where(), "started": time.time()}
    if not layout.ray.is_dir():  # made by the submitting command: this node does not see the job folder
        raise WorkerFailed(f"rank {rank} on {record['host']} ({record['node_ip']}) does not see the job folder "
                           f"{layout.root}: the job folder and the data dir must be on storage every node shares, "
                           "at the same path")
    write_private_text(record_path(layout, rank), json.dumps(record))
    done = threading.Event()
    try:
        root = cli._prepare(spec, data_dir)
        code = cli._run(spec, layout, root, on_trainer=lambda trainer: _watch_stop(layout, trainer, done, rank))
    except StorageError as exc:  # this node cannot write the data dir or the job folder
        print(f"fusetune: rank {rank}: {exc}", file=sys.stderr, flush=True)
        code = cli.EXIT_IO
    finally:
        done.set()
    write_private_text(record_path(layout, rank), json.dumps({**record, "code": code, "ended": time.time()}))
    if code not in (0, EXIT_CANCELLED):
        raise WorkerFailed(f"rank {rank} exited with code {code}")


def _watch_stop(layout: JobLayout, trainer, done: threading.Event, rank: int) -> None:
    """Set the trainer's stop flag once the job's stop request appears (the ranks then agree on a step)."""
    def watch() -> None:
        while not done.wait(STOP_POLL_S):
            if layout.stop_workers.exists():
                if rank == 0:
                    print("stop requested: stopping after this step", flush=True)
                trainer.stop_requested = True
                return
    threading.Thread(target=watch, daemon=True, name="fusetune-stop-watch").start()
