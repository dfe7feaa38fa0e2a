"""What Start checks before anything is queued, and the fit check beside the form.

1. The studio's read policy (jobs/checks/access.py) on the raw form values, before JobSpec sees them
   (JobSpec's "does not exist" would tell a visitor which files exist).
2. The preflight `python -m jobs.train CONFIG --dry-run` runs (jobs/preflight.run_preflight): the
   model resolves, target modules exist, the whole dataset is read and every bad row counted.
   Small data is checked in the studio process with the model's config and tokenizer kept between
   clicks (jobs.checks.preflight.ModelFiles); a data file over IN_PROCESS_BYTES, a hub dataset, or
   any image-text job is checked by a child process (studio/preflight_child.py) that answers with
   the report as JSON and exits, so a huge file or a decompression bomb never sits in the studio's
   memory (issue 12's bounded reading; issue 36: no image is opened in the studio's process).
3. The predicted peak GPU memory (jobs/models/fit.py) against the free memory of the job's GPU.
"""
from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable

from jobs.spec import BUILTIN_DATASETS, BUILTIN_MODEL, DATASET_SUFFIXES, JobSpec
from studio import form

IN_PROCESS_BYTES = 32 * 2 ** 20
CHILD_TIMEOUT_S = 600
ROOT = Path(__file__).resolve().parents[1]


@dataclass
class Verdict:
    """The preflight's answer: problems as (JobSpec key, message), the model folder it resolved."""

    problems: list[tuple[str, str]] = field(default_factory=list)
    model_source: str | None = None
    datasets: list[dict[str, Any]] = field(default_factory=list)   # DatasetSummary as dicts (statistics)

    @property
    def ok(self) -> bool:
        return not self.problems


@dataclass
class FitView:
    """The fit check: the estimate (None when the model's config is not at hand yet) and the free
    memory of the GPU the job would use (None on a machine without an NVIDIA GPU)."""

    estimate: Any
    gpu: int
    free_gb: float | None
    time: Any = None   # on a CPU: jobs.models.step_time.TimeEstimate from a measured step, when known

    @property
    def on_cpu(self) -> bool:
        return self.free_gb is None

    @property
    def fits(self) -> bool:
        return self.on_cpu or self.estimate is None or self.estimate.fits(self.free_gb)


class StartCheck:
    """One studio's checks; `free_memory(index)` is jobs.models.fit.free_gpu_memory (tests pass their own)."""

    def __init__(self, data_dir: Path, free_memory: Callable[[int], float | None] | None = None,
                 in_process_bytes: int = IN_PROCESS_BYTES):
        from jobs.checks.preflight import ModelFiles
        self.data_dir = Path(data_dir)
        self.in_process_bytes = in_process_bytes
        self._free_memory = free_memory
        self._files = ModelFiles()
        self._sources: dict[str, str] = {}   # model as typed -> the folder a preflight resolved
        self._lock = threading.Lock()        # one preflight at a time shares the cached tokenizer
        self._measured: dict[str, list[dict[str, Any]]] = {}   # spec YAML -> its datasets' statistics
        self._builtin_rows: dict[tuple, int | None] = {}   # a built-in dataset's longest row, by what decides it
        self._per_token: dict[tuple, float | None] = {}   # step_time.measure_key -> CPU seconds per token
        self._time_lock = threading.Lock()

    def spec(self, names: list[str], values: list[Any]) -> JobSpec:
        """The form's job after the read policy; SpecError (AccessError) naming the field."""
        from jobs.checks.access import DataAccess
        data = DataAccess.for_studio(self.data_dir).check_values(form.values_to_dict(names, values))
        return JobSpec.from_dict(data)

    def preflight(self, spec: JobSpec) -> Verdict:
        if self._large_data(spec):
            verdict = self._in_child(spec)
        else:
            from jobs.checks.access import DataAccess
            from jobs.checks.preflight import run_preflight
            with self._lock:
                report = run_preflight(spec, data_dir=self.data_dir, access=DataAccess.for_studio(self.data_dir),
                                       log=lambda _line: None, model_files=self._files, open_images=False)
            verdict = Verdict([(p.key, p.message) for p in report.problems], report.model_source,
                              [dict(vars(d)) for d in report.datasets])
            if report.images_deferred:   # an image-text job: its images are opened by the child alone
                verdict = self._in_child(spec)
        if verdict.model_source:
            self._sources[spec.model] = verdict.model_source
        self._remember(spec, verdict.datasets)
        return verdict

    def _remember(self, spec: JobSpec, datasets: list[dict[str, Any]]) -> None:
        """The statistics of the last few checked configs, so that the warning beside Start can
        follow a Start press without measuring the data twice (studio/data_stats.py)."""
        self._measured.pop(spec.to_yaml(), None)
        self._measured[spec.to_yaml()] = datasets
        while len(self._measured) > 8:
            self._measured.pop(next(iter(self._measured)))

    def measured(self, spec: JobSpec) -> list[dict[str, Any]]:
        """The statistics a preflight of exactly this config found ([] when none ran)."""
        return self._measured.get(spec.to_yaml(), [])

    def longest_row(self, spec: JobSpec) -> int | None:
        """The training data's longest row in tokens, once a Start check measured it; a built-in
        dataset's is measured here at once (a few hundred rows, in this process, never generated:
        the preflight reads cached answers only), so the demos' CPU RAM is right before Start."""
        train = next((d for d in self.measured(spec) if d.get("key") == "dataset"), {})
        longest = (train.get("tokens") or {}).get("max")
        if longest is not None or spec.dataset not in BUILTIN_DATASETS:
            return longest
        key = (spec.model, spec.dataset, spec.method, spec.bot_name, spec.bot_author, spec.max_seq_length, spec.seed)
        if key not in self._builtin_rows:
            try:
                verdict = self.preflight(spec)
            except Exception:  # noqa: BLE001 (an estimate's helper: never a failure of the fit check)
                verdict = None
            train = next((d for d in (verdict.datasets if verdict else []) if d.get("key") == "dataset"), {})
            self._builtin_rows[key] = (train.get("tokens") or {}).get("max")
        return self._builtin_rows[key]

    def _large_data(self, spec: JobSpec) -> bool:
        for reference in (spec.dataset, spec.eval_dataset):
            if not reference or reference in BUILTIN_DATASETS:
                continue
            path = Path(reference)
            if path.suffix.lower() not in DATASET_SUFFIXES:
                return True   # a hub dataset: its size is unknown until it is read
            if path.is_file() and path.stat().st_size > self.in_process_bytes:
                return True
        return False

    def _in_child(self, spec: JobSpec) -> Verdict:
        argv = [sys.executable, "-m", "studio.preflight_child", str(self.data_dir)]
        try:
            done = subprocess.run(argv, input=json.dumps(spec.to_dict()), capture_output=True, text=True,
                                  cwd=ROOT, timeout=CHILD_TIMEOUT_S, env=os.environ.copy())
            report = json.loads(done.stdout.strip().splitlines()[-1])
        except (subprocess.TimeoutExpired, OSError, ValueError, IndexError) as exc:
            detail = getattr(exc, "stderr", None) or str(exc)
            return Verdict([("dataset", f"the check of the data did not finish: {str(detail)[-400:]}")])
        return Verdict([(p["key"], p["message"]) for p in report["problems"]], report.get("model_source"),
                       report.get("datasets") or [])

    # ---- the fit check ---------------------------------------------------------------------
    def fit(self, spec: JobSpec, source: str | None = None) -> FitView:
        gpu = (spec.gpu_indices() or [0])[0]
        free = self._free_gb(gpu)
        source = source or self._known_source(spec.model)
        estimate = None
        if source is not None:
            from jobs.models import fit
            from jobs.models.load import ModelError
            try:
                if free is None:   # on a CPU: the job's peak RSS as the CPU trainer runs it (jobs/models/fit_cpu.py)
                    from jobs.models.fit_cpu import estimate_ram
                    estimate = estimate_ram(spec, self._files.config(source), self.longest_row(spec))
                else:
                    estimate = fit.estimate_peak(spec, self._files.config(source), **_gpu_bytes(free))
                if free is not None:   # per GPU when sharded; how many GPUs it needs (jobs/models/fit_shard.py)
                    from jobs.models import fit_shard
                    estimate = fit_shard.for_job(spec, self._files.config(source), estimate, free, **_gpu_bytes(free))
            except (ModelError, ValueError, AttributeError, KeyError, TypeError):
                estimate = None   # an architecture jobs/models/fit.py cannot size: no number rather than a wrong one
        view = FitView(estimate, gpu, free)
        if free is None and source is not None:
            view.time = self.cpu_time(spec, source)
        return view

    def cpu_time(self, spec: JobSpec, source: str) -> Any:
        """About how long `spec` runs on this CPU: one short step measured per model and LoRA shape
        (cached: a form change re-scales it, never re-measures), scaled by the job's tokens (the
        data's mean row, once a Start check measured it; else max_seq_length, an upper bound)."""
        from jobs.models import step_time
        key = step_time.measure_key(spec, source)
        with self._time_lock:
            if key not in self._per_token:
                self._per_token[key] = self.measure_step(spec, source)
        per_token = self._per_token[key]
        if per_token is None:
            return None
        train = next((d for d in self.measured(spec) if d.get("key") == "dataset"), {})
        rows = (train.get("rows") or 0) - (train.get("rows_without_answer") or 0)
        return step_time.estimate_time(spec, per_token, (train.get("tokens") or {}).get("mean"), rows or None)

    def measure_step(self, spec: JobSpec, source: str) -> float | None:
        """Seconds per token of one training step, measured by `python -m jobs.models.step_time` in
        a child process (its model never sits in the studio's memory, and the studio's handlers
        keep running meanwhile); None when it fails (an unloadable model: no time, not a wrong one)."""
        request = json.dumps({"spec": spec.to_dict(), "source": source})
        try:
            done = subprocess.run([sys.executable, "-m", "jobs.models.step_time"], input=request,
                                  capture_output=True, text=True, cwd=ROOT, timeout=CHILD_TIMEOUT_S,
                                  env=os.environ.copy())
            return float(json.loads(done.stdout.strip().splitlines()[-1])["seconds_per_token"])
        except (subprocess.TimeoutExpired, OSError, ValueError, IndexError, KeyError, TypeError):
            return None

    def vision_kind(self, spec: JobSpec) -> tuple[str, str] | None:
        """("supported", family) or ("refused", reason) for a vision-language model whose folder is at
        hand (jobs/models/vision.py); None for a text model or one not found for free."""
        source = self._known_source(spec.model)
        if source is None:
            return None
        from jobs.models import vision
        from jobs.models.load import ModelError
        try:
            config = self._files.config(source)
        except ModelError:
            return None
        if not vision.is_vision_config(config):
            return None
        reason = vision.refusal(config)
        return ("refused", reason) if reason else ("supported", vision.SUPPORTED[config.model_type])

    def _free_gb(self, gpu: int) -> float | None:
        if self._free_memory is None:
            from jobs.models.fit import free_gpu_memory
            self._free_memory = free_gpu_memory
        return self._free_memory(gpu)

    def _known_source(self, model: str) -> str | None:
        """The model's folder when finding it costs nothing (no conversion, no download)."""
        from jobs.models import hub
        from jobs.io import paths
        from jobs.models import builtin as smollm2
        if model in self._sources:
            return self._sources[model]
        if model == BUILTIN_MODEL:
            folder = paths.model_cache_dir(paths.data_dir(self.data_dir)) / smollm2.CACHE_NAME
        elif model.startswith(("/", "~", ".")):
            folder = Path(model).expanduser()
        else:
            cached = hub.cached_snapshot(model) if "/" in model else None
            return str(cached) if cached else None
        return str(folder) if (folder / "config.json").is_file() else None


def _gpu_bytes(free_gb: float | None) -> dict[str, int]:
    """estimate_peak's free/total memory for "auto" checkpointing: the chosen GPU's free memory
    (never GPU 0's when another was picked); nothing on CPU (it then assumes full recompute)."""
    if free_gb is None:
        return {}
    return {"free_bytes": int(free_gb * 2 ** 30), "total_bytes": int(free_gb * 2 ** 30)}
