"""The runner's refusals (RunnerError), a job's default display name, the runner's own lines on stderr, and an action guarded so that one job's failure never stops the queue
(a full disk is one line; anything else gets its traceback)."""
from __future__ import annotations

import sys
import traceback

from jobs.io.storage import as_storage_error, is_disk_error
from jobs.queue.store import JobRecord
from jobs.spec import BUILTIN_DATASET, JobSpec, short_name


class RunnerError(RuntimeError):
    """A request the runner refuses (deleting a running job, ...); the message says why and what to do."""


def _guarded(record: JobRecord, action) -> None:
    try:
        action(record)
    except Exception as exc:
        if not is_disk_error(exc):  # a full disk is one line; anything else gets its traceback
            _log(f"job {record.id}: {action.__name__} failed:\n{traceback.format_exc()}")
        else:
            _log(f"job {record.id}: {action.__name__} failed: {as_storage_error(exc, record.job_dir)}")


def _log(message: str) -> None:
    print(f"[runner] {message}", file=sys.stderr, flush=True)


def default_name(spec: JobSpec) -> str:
    """"model · dataset", plus " · bot name" for the identity dataset (whose rows differ by it)."""
    name = f"{short_name(spec.model)} · {short_name(spec.dataset)}"
    return f"{name} · {spec.bot_name.strip()}" if spec.dataset == BUILTIN_DATASET and spec.bot_name.strip() else name
