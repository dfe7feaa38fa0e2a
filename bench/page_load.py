"""The Jobs tab's poll under load: N pages polling every POLL_S seconds while a job trains.

    python bench/page_load.py [--clients 30] [--seconds 60] [--out bench/results/page_load.jsonl]

A real Runner on a temporary data dir trains a tiny Llama on CPU (a few thousand steps, so that it
writes a step event every fraction of a second for the whole run); N threads then play N open pages:
each keeps its own signatures and calls studio/jobs_tab.py `refresh` on its timer like the page's
gr.Timer does, for `--seconds`. Loopback only: nothing listens on a port. Two modes are measured
one after the other on the same job: `before` (each poll reads the whole events file and computes
its own table and detail, as the tab did before the shared views and the incremental reader) and
`after` (EventTail + SharedViews). It records p50/p95/max of the poll's time, the polls done, and
the machine's load average; it stops by itself (bounded loops) and cancels the job at the end.
What it leaves out: Gradio's own per-event cost (queue, JSON, SSE), the same for both modes."""
from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import threading
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))


def start_job(data_dir: Path):
    from jobs.queue.runner import Runner
    from jobs.spec import JobSpec
    from tests.tiny import make_tiny_model
    runner = Runner(data_dir)
    model = make_tiny_model(data_dir / "tiny")
    record = runner.submit(JobSpec(model=str(model), max_steps=5000, save_steps=0, batch_size=2,
                                   max_seq_length=64, learning_rate=1e-3, name="page-load"))
    runner.start_monitor(0.5)
    return runner, record


def wait_for_steps(ctx, record, steps: int, limit_s: float) -> None:
    started = time.monotonic()
    while time.monotonic() - started < limit_s:
        summary = ctx.events.get(record.job_dir)
        if len(summary.steps) >= steps:
            return
        time.sleep(1)
    raise SystemExit(f"the job wrote fewer than {steps} steps in {limit_s:.0f} s; see {record.job_dir}")


def page(ctx, job_id: str, shared: bool, seconds: float, times: list, stop: threading.Event) -> None:
    from studio.jobs_tab import POLL_S, refresh
    out = refresh(ctx, job_id, None, None, pick=True)
    t_sig, d_sig = out[-3], out[-2]   # [..., table_sig, detail_sig, timer]
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline and not stop.is_set():
        began = time.monotonic()
        out = refresh(ctx, job_id, t_sig, d_sig, shared=shared)
        times.append(time.monotonic() - began)
        t_sig, d_sig = out[-3], out[-2]   # [..., table_sig, detail_sig, timer]
        time.sleep(max(0.0, POLL_S - (time.monotonic() - began)))


def measure(runner, data_dir: Path, record, mode: str, clients: int, seconds: float) -> dict:
    from jobs.io.events import read_events
    from studio.context import StudioContext
    from studio.jobs_view import EventCache
    events = EventCache(lambda d: read_events(d)) if mode == "before" else EventCache()
    ctx = StudioContext(data_dir=data_dir, runner=runner, events=events)
    if mode == "before":
        ctx.shared = NoSharing()
    times: list[float] = []
    stop = threading.Event()
    threads = [threading.Thread(target=page, args=(ctx, record.id, mode == "after", seconds, times, stop))
               for _ in range(clients)]
    load = os.getloadavg()[0]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(seconds + 120)
    stop.set()
    steps = len(ctx.events.get(record.job_dir).steps)
    cut = sorted(times)
    return {"bench": "page_load", "mode": mode, "clients": clients, "seconds": seconds, "polls": len(times),
            "p50_s": round(statistics.median(cut), 4), "p95_s": round(cut[int(0.95 * (len(cut) - 1))], 4),
            "max_s": round(cut[-1], 4), "job_steps_in_file": steps, "load_avg_1m_before": round(load, 1),
            "cpus": len(os.sched_getaffinity(0)), "date": time.strftime("%Y-%m-%d")}


class NoSharing:
    """SharedViews' interface, computing every time: each page pays for its own views (before)."""

    generation = 0

    def get(self, _key, compute, _ttl=None):
        return compute()


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--clients", type=int, default=30)
    parser.add_argument("--seconds", type=float, default=60)
    parser.add_argument("--out", default=str(ROOT / "bench/results/page_load.jsonl"))
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="page_load_", ignore_cleanup_errors=True) as tmp:
        data_dir = Path(tmp)
        runner, record = start_job(data_dir)
        try:
            from studio.context import StudioContext
            wait_for_steps(StudioContext(data_dir=data_dir, runner=runner), record, 20, 600)
            for mode in ("before", "after"):
                row = measure(runner, data_dir, record, mode, args.clients, args.seconds)
                print(json.dumps(row), flush=True)
                with open(args.out, "a") as fh:
                    fh.write(json.dumps(row) + "\n")
        finally:
            runner.cancel(record.id)
            time.sleep(3)   # let the trainer stop writing before its folder goes
            runner.shutdown()


if __name__ == "__main__":
    main()
