"""`python -m studio.preflight_child DATA_DIR` with a JobSpec as JSON on stdin: the Start check of
a large dataset in its own process (studio/start_check.py), so the studio's memory stays flat. The
last line of stdout is the preflight report as JSON (jobs.checks.preflight.PreflightReport.as_dict). The
studio's read policy was applied to the spec already; it is applied again here (the same
$FUSETUNE_ALLOW_DIRS reaches this process)."""
from __future__ import annotations

import json
import sys

from jobs.io import paths
from jobs.checks.access import DataAccess
from jobs.checks.preflight import run_preflight
from jobs.spec import JobSpec


def main(argv: list[str]) -> int:
    data_dir = paths.data_dir(argv[0])
    paths.use_data_dir_caches(data_dir)
    spec = JobSpec.from_dict(json.loads(sys.stdin.read()))
    report = run_preflight(spec, data_dir=data_dir, access=DataAccess.for_studio(data_dir), log=lambda _line: None)
    print(json.dumps(report.as_dict(), default=str), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
