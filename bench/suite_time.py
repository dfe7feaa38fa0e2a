"""One line per change in bench/results/suite_time.jsonl: how long the whole suite took (issue 41:
CI's `.ci/run` must finish in 35 minutes on 2 cores, install included), so that growth is seen when
it happens, not when CI's 90-minute limit is hit.

    bash .ci/run                                      # or: bash scripts/test.sh 2>&1 | tee run.log
    python bench/suite_time.py .ci/last-run.log --note "what changed"

Reads pytest's summary line, `.ci/run`'s total line and the slowest tests (`--durations`)."""
from __future__ import annotations

import argparse
import datetime
import json
import os
import re
import subprocess
from pathlib import Path

RESULTS = Path(__file__).resolve().parent / "results" / "suite_time.jsonl"
# `-q` (what scripts/test.sh passes) prints the bare line "1 failed, 1160 passed, 2 errors in 1800.40s
# (0:30:00)"; without it pytest fences the same line in "=" signs
SUMMARY = re.compile(r"^(?:=+ )?(?P<counts>\d+ \w+(?:, \d+ \w+)*) in (?P<seconds>[\d.]+)s\b")
COUNT = re.compile(r"(\d+) (passed|failed|errors?|skipped|xfailed|xpassed|deselected)")
SLOW = re.compile(r"^(?P<seconds>[\d.]+)s (?P<when>call|setup|teardown)\s+(?P<test>\S+)")
TOTAL = re.compile(r"^suite total \(install and tests\): (\d+) s")
WORKERS = re.compile(r"^(?:created: \d+/)?(\d+) workers\b")   # xdist's "2 workers [1167 items]"
PER_WORKER = re.compile(r"^seconds of tests per worker: (.+)$")   # tests/suite_plan.py: "gw0 1730, gw1 1724"


def parse(text: str) -> dict:
    row: dict = {"tests_s": None, "total_s": None, "workers": 1, "counts": {}, "slowest": []}
    for line in text.splitlines():
        if m := SUMMARY.match(line):
            row["tests_s"] = round(float(m["seconds"]))
            row["counts"] = {kind.rstrip("s") if kind.startswith("error") else kind: int(n)
                             for n, kind in COUNT.findall(m["counts"])}
        elif m := TOTAL.match(line):
            row["total_s"] = int(m[1])
        elif (m := SLOW.match(line)) and len(row["slowest"]) < 5:
            row["slowest"].append([m["test"].split("@")[0], round(float(m["seconds"]))])
        elif m := WORKERS.match(line):
            row["workers"] = int(m[1])
        elif m := PER_WORKER.match(line):
            row["worker_s"] = {name: int(seconds) for name, seconds in re.findall(r"(\w+) (\d+)", m[1])}
            row["workers"] = len(row["worker_s"])
    return row


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("log", help="the output of `bash .ci/run` or `bash scripts/test.sh`")
    parser.add_argument("--note", default="", help="what changed, and how busy the machine was")
    parser.add_argument("--repo", default=".", help="the checkout that ran (a CI clone): its HEAD is the line's commit")
    args = parser.parse_args(argv)
    row = parse(Path(args.log).read_text(errors="replace"))
    if row["tests_s"] is None:
        raise SystemExit(f"{args.log}: no pytest summary line (did the run finish?)")
    commit = subprocess.run(["git", "-C", args.repo, "rev-parse", "--short", "HEAD"], capture_output=True,
                            text=True).stdout.strip()
    row = {"time": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"), "commit": commit,
           "cpus": os.cpu_count(), **row, "note": args.note}
    with RESULTS.open("a") as out:
        out.write(json.dumps(row) + "\n")
    print(json.dumps(row))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
