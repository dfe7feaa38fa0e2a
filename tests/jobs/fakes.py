"""A fast stand-in trainer for runner tests, and a worker process for the two-studios race.

The runner starts `<python> -m jobs.train CONFIG --data-dir DIR`; with `Runner(python=fake)` it
runs the shell script below instead, which writes the same events a trainer writes, in
milliseconds. The job's `name` picks what it does: `hang` runs until SIGTERM (then reports
cancelled like the real trainer), `crash` exits 3 without reporting, anything else finishes
(after $FAKE_TRAINER_SECONDS, and once the file $FAKE_TRAINER_WAIT_FOR exists when that is set).
Each start appends one line to <job>/starts, so a test can count how often a job was started."""
from __future__ import annotations

import sys
import time
from pathlib import Path


FAKE_TRAINER = r"""#!/bin/sh
config="$3"
job=$(dirname "$config")
echo "$$ $(date +%s.%N)" >> "$job/starts"
event() { printf '%s\n' "$1" >> "$job/events.jsonl"; }
event '{"type": "start", "time": 0, "max_steps": 1, "resumed_at": 0}'
if grep -q '^name: hang' "$config"; then
  trap 'event "{\"type\": \"error\", \"time\": 0, \"kind\": \"killed\", \"message\": \"cancelled by the user\"}"; exit 130' TERM
  while :; do sleep 0.05; done
fi
if grep -q '^name: crash' "$config"; then
  exit 3
fi
sleep "${FAKE_TRAINER_SECONDS:-0.05}"
if [ -n "$FAKE_TRAINER_WAIT_FOR" ]; then
  while [ ! -e "$FAKE_TRAINER_WAIT_FOR" ]; do sleep 0.02; done
fi
event '{"type": "step", "time": 0, "step": 1, "max_steps": 1, "loss": 1.0}'
event '{"type": "done", "time": 0, "step": 1, "final_loss": 1.0}'
echo "$$ $(date +%s.%N)" >> "$job/ends"
"""


def write_fake_trainer(folder: Path) -> Path:
    path = Path(folder) / "fake-trainer.sh"
    path.write_text(FAKE_TRAINER)
    path.chmod(0o755)
    return path


def starts(job_dir: str | Path) -> list[str]:
    path = Path(job_dir) / "starts"
    return path.read_text().splitlines() if path.is_file() else []


def race(data_dir: str, fake: str, rounds: int, go_file: str) -> None:
    """One 'studio': submit `rounds` jobs while reconciling as fast as possible, then drain the
    queue. Two of these on one data dir race for every claim."""
    from jobs.queue.runner import Runner
    from jobs.spec import JobSpec

    runner = Runner(data_dir, python=fake, max_running=1)
    print(runner.owner, flush=True)
    while not Path(go_file).exists():
        time.sleep(0.001)
    for _ in range(rounds):
        runner.submit(JobSpec(name="race"))
        runner.reconcile()
    deadline = time.time() + 90
    while time.time() < deadline and any(r.active for r in runner.store.list()):
        runner.reconcile()
        time.sleep(0.002)
    runner.reconcile()  # reap our last children


if __name__ == "__main__":
    command, *args = sys.argv[1:]
    if command == "race":
        race(args[0], args[1], int(args[2]), args[3])
