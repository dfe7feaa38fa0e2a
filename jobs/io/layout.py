"""The one place that knows a job folder's layout (docs/contracts.md, "Job output dir").

Every module that reads or writes a job's files asks a `JobLayout` for the path instead of
joining names itself, so the layout can change in one place."""
from __future__ import annotations

import secrets
import time
from dataclasses import dataclass
from pathlib import Path

CONFIG_FILE = "config.yaml"
LOG_FILE = "train.log"
EVENTS_FILE = "events.jsonl"
COMPLETIONS_FILE = "completions.jsonl"   # grpo: a few sampled completions per step, with their rewards
CANCEL_FILE = "cancel.request"
# a Ray cluster job (jobs/train/cluster.py): the stop request its workers watch, and a folder with Ray
# Train's run state and each worker's node, pid and exit code (jobs/train/ray_worker.py)
STOP_WORKERS_FILE = ".stop-workers"
RAY_DIR = "ray"
CONTINUES_FILE = "continues.json"   # "train more steps": the finished job this one continues
CHECKPOINTS_DIR = "checkpoints"
ADAPTER_DIR = "adapter"
BEST_ADAPTER_DIR = "adapter-best"
EXPORTS_DIR = "exports"
EXPORT_LOCK = ".export.lock"
ADAPTER_WEIGHTS = "adapter_model.safetensors"
ADAPTER_CONFIG = "adapter_config.json"
MODEL_CARD = "README.md"
TRAINER_STATE = "trainer_state.json"
OPTIMIZER_STATE = "optim.pt"
# python -m jobs.evaluate: one folder per evaluation run, evaluations/<name>/ (EvalLayout)
EVALUATIONS_DIR = "evaluations"
EVAL_ROWS_FILE = "rows.jsonl"
EVAL_ROWS_CSV = "rows.csv"
EVAL_RESULTS_FILE = "results.json"
EVAL_BENCHMARKS_FILE = "benchmarks.json"
EVAL_LOG_FILE = "evaluate.log"


@dataclass(frozen=True)
class _RunFolder:
    """What a job's folder and an evaluation's folder share: the config as run, its events (read by the
    same readers) and the cancel request the queue writes (both are run by jobs/queue/runner.py)."""

    root: Path

    def __post_init__(self) -> None:
        object.__setattr__(self, "root", Path(self.root))

    @property
    def config(self) -> Path:
        return self.root / CONFIG_FILE

    @property
    def events(self) -> Path:
        return self.root / EVENTS_FILE

    @property
    def cancel_request(self) -> Path:
        return self.root / CANCEL_FILE


@dataclass(frozen=True)
class JobLayout(_RunFolder):
    """Paths inside one job's output folder."""

    @property
    def log(self) -> Path:
        return self.root / LOG_FILE

    @property
    def completions(self) -> Path:
        return self.root / COMPLETIONS_FILE

    @property
    def stop_workers(self) -> Path:
        return self.root / STOP_WORKERS_FILE

    @property
    def ray(self) -> Path:
        return self.root / RAY_DIR

    @property
    def continues(self) -> Path:
        return self.root / CONTINUES_FILE

    @property
    def checkpoints(self) -> Path:
        return self.root / CHECKPOINTS_DIR

    def checkpoint(self, step: int) -> Path:
        return self.checkpoints / f"step-{step}"

    def partial_checkpoint(self, step: int) -> Path:
        return self.checkpoints / f".step-{step}.partial"

    @property
    def adapter(self) -> Path:
        return self.root / ADAPTER_DIR

    @property
    def partial_adapter(self) -> Path:
        return self.root / f".{ADAPTER_DIR}.partial"

    def partials(self) -> list[Path]:
        """Half-written folders a process killed mid-save leaves behind (never valid to read)."""
        return list(self.checkpoints.glob(".step-*.partial")) + list(self.root.glob(".*.partial"))

    @property
    def best_adapter(self) -> Path:
        return self.root / BEST_ADAPTER_DIR

    @property
    def exports(self) -> Path:
        return self.root / EXPORTS_DIR

    @property
    def export_lock(self) -> Path:
        """Held (flock, shared) by every export of this job while it runs; delete takes it exclusively."""
        return self.root / EXPORT_LOCK

    @property
    def model_card(self) -> Path:
        return self.adapter / MODEL_CARD

    @property
    def evaluations(self) -> Path:
        return self.root / EVALUATIONS_DIR

    def evaluation(self, name: str) -> "EvalLayout":
        return EvalLayout(self.evaluations / name)

    def has_adapter(self) -> bool:
        """True once the finished (or cancelled) job's adapter is complete on disk."""
        return (self.adapter / ADAPTER_WEIGHTS).is_file() and (self.adapter / ADAPTER_CONFIG).is_file()


@dataclass(frozen=True)
class EvalLayout(_RunFolder):
    """Paths inside one evaluation's folder, `<job>/evaluations/<name>/` (docs/contracts.md, "Evaluate").
    Its config.yaml, events.jsonl and cancel.request are a job folder's (_RunFolder), so the job readers
    and the queue read them too."""

    @property
    def log(self) -> Path:
        return self.root / EVAL_LOG_FILE

    @property
    def rows(self) -> Path:
        """Per row: prompt, reference, base and tuned answers, their scores (one JSON object a line)."""
        return self.root / EVAL_ROWS_FILE

    @property
    def rows_csv(self) -> Path:
        return self.root / EVAL_ROWS_CSV

    @property
    def results(self) -> Path:
        """The base-vs-tuned table: per metric the means, the difference and its bootstrap interval."""
        return self.root / EVAL_RESULTS_FILE

    @property
    def benchmarks(self) -> Path:
        """lm-evaluation-harness results, base and tuned, per task."""
        return self.root / EVAL_BENCHMARKS_FILE


def new_job_folder(jobs_dir: str | Path, tries: int = 8) -> tuple[str, JobLayout]:
    """Create a fresh job folder (0700) and return its id and layout. The id is the time to the
    second plus a random tail; `mkdir` is the claim, so two studios submitting in the same second
    on one data dir never share a folder: a clash (rare, and only between processes) draws again."""
    for attempt in range(tries):
        job_id = time.strftime("%Y%m%d-%H%M%S") + "-" + secrets.token_hex(3)
        layout = JobLayout(Path(jobs_dir) / job_id)
        try:
            layout.root.mkdir(mode=0o700)
        except FileExistsError:
            if attempt == tries - 1:
                raise
            continue
        return job_id, layout
    raise AssertionError("unreachable")


def new_eval_folder(job_dir: str | Path, name: str = "") -> EvalLayout:
    """A fresh evaluation folder (0700) under the job's evaluations/, named `name` or the time; a clash
    of times gets a -2, -3 tail (a clash of a given name is a FileExistsError)."""
    base = name or time.strftime("%Y%m%d-%H%M%S")
    for attempt in range(1, 100):
        layout = JobLayout(Path(job_dir).expanduser()).evaluation(base if attempt == 1 else f"{base}-{attempt}")
        layout.root.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
        try:
            layout.root.mkdir(mode=0o700)
            return layout
        except FileExistsError:
            if name:
                raise
    raise FileExistsError(base)
