"""Preflight: everything that can be checked about a job before it is queued, in a few seconds.

The studio's Start button and `python -m jobs.train CONFIG --dry-run` both run `run_preflight`:
the model resolves (a hub id that cannot load is refused at once, jobs/models/hub.py), the tokenizer has a
chat template (or the ChatML fallback is named), target_modules exist in the model (built on the
meta device from its config: no weights load), max_seq_length is within the model's positions, and
the whole dataset (and eval_dataset) is read, every bad row counted and the first 10 named. The
report also carries what a user wants to see before spending GPU time: rows, token lengths,
trained tokens, and the predicted peak GPU memory when jobs/models/fit.py is there. The trainer keeps its
own checks; this is the same code run earlier."""
from __future__ import annotations

import importlib.util
import random
import statistics
import time
from dataclasses import dataclass, field
from typing import Any

from jobs.messages import say
from jobs.data.conversation import DataError
from jobs.spec import BUILTIN_CONCISE, BUILTIN_DATASET, PREFERENCE_METHODS, JobSpec, SpecError

TOKEN_SAMPLE = 2000  # rows tokenized for the length statistics; beyond this they are estimated


class PreflightError(SpecError):
    """A job refused before queueing; `key` is the first refused field, the message lists all."""


@dataclass
class Finding:
    key: str
    message: str

    def __str__(self) -> str:
        return f"{self.key}: {self.message}"


@dataclass
class DatasetSummary:
    key: str
    name: str
    rows: int
    format: str
    tokens: dict[str, float] = field(default_factory=dict)  # min, mean, p95, max per row
    tokens_total: int = 0          # every row once (an estimate when sampled)
    trained_tokens: int = 0        # answer tokens within max_seq_length, every row once
    truncated_rows: int = 0
    rows_without_answer: int = 0   # nothing left to train on within max_seq_length
    sampled: int | None = None     # rows tokenized when not all of them were
    duplicates: int = 0            # rows repeating an earlier row exactly (every row)
    stats: dict[str, Any] = field(default_factory=dict)  # jobs.data.stats.LengthStats (measured rows)


@dataclass
class PreflightReport:
    spec: JobSpec
    problems: list[Finding] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    model_source: str | None = None
    chat_template: str | None = None
    max_positions: int | None = None
    datasets: list[DatasetSummary] = field(default_factory=list)
    predicted_memory: str | None = None
    seconds: float = 0.0
    images_deferred: bool = False  # an image-text job whose images were left to a child (open_images False)

    @property
    def ok(self) -> bool:
        return not self.problems

    def fail(self, key: str, message: str) -> None:
        self.problems.append(Finding(key, message))

    def error(self) -> PreflightError | None:
        if self.ok:
            return None
        if len(self.problems) == 1:
            return PreflightError(self.problems[0].key, self.problems[0].message)
        first = self.problems[0]
        rest = "; ".join(str(p) for p in self.problems[1:])
        return PreflightError(first.key, say("preflight_also", message=first.message, findings=rest))

    def raise_if_failed(self) -> "PreflightReport":
        error = self.error()
        if error is not None:
            raise error
        return self

    def summary(self) -> str:
        from jobs.checks.summary import summary_text
        return summary_text(self)

    def as_dict(self) -> dict[str, Any]:
        return {"ok": self.ok, "problems": [{"key": p.key, "message": p.message} for p in self.problems],
                "notes": self.notes, "model_source": self.model_source, "chat_template": self.chat_template,
                "max_positions": self.max_positions, "predicted_memory": self.predicted_memory,
                "datasets": [vars(d) for d in self.datasets], "seconds": round(self.seconds, 2),
                "images_deferred": self.images_deferred}


def run_preflight(spec: JobSpec, data_dir=None, access=None, log=print, limit: int | None = None,
                  model_files: "ModelFiles | None" = None, open_images: bool = True) -> PreflightReport:
    """Check `spec` as far as possible without training; never raises for bad input (the report
    lists it, each finding naming its JobSpec field). `access` (a jobs.checks.access.DataAccess) makes the
    studio's read policy part of the check; `limit` overrides the row size limit; `model_files`
    keeps configs and tokenizers between calls (the studio's Start clicks). `open_images` False (the
    studio's own process): an image-text job stops at the model checks with `images_deferred` set,
    so that its images are opened only by a child process (studio/start_check.py, issue 36)."""
    began = time.time()
    spec = JobSpec.from_dict(spec.to_dict())  # checks below may normalise paths: never the caller's
    report = PreflightReport(spec=spec)
    if access is not None:
        from jobs.checks.access import AccessError
        try:
            access.check_spec(spec)
        except AccessError as exc:
            report.fail(exc.key or "dataset", str(exc).removeprefix(f"{exc.key}: "))
            report.seconds = time.time() - began
            return report
    _check_gpus(spec, report)
    _check_trackers(spec, report)
    config, tokenizer = _check_model(spec, data_dir, report, log, model_files or ModelFiles(size=0))
    from jobs.checks import vision   # image-text jobs are checked apart (jobs/checks/vision.py)
    is_vision = config is not None and vision.is_vision_config(config)
    if is_vision and not open_images:
        report.images_deferred = True
        report.seconds = time.time() - began
        return report
    if is_vision:
        vision.check_vision_job(spec, config, tokenizer, report.model_source, data_dir, report, DatasetSummary)
    elif not vision.check_text_model_data(spec, report, model_known=config is not None):
        is_vision = True   # refused: the text checks below would only repeat it
    for key in ("dataset", "eval_dataset") if spec.method != "grpo" and not is_vision else ():
        if getattr(spec, key):
            _check_dataset(spec, key, tokenizer, data_dir, report, limit)
    if spec.method == "grpo":   # prompt data and rewards (jobs/checks/grpo.py)
        from jobs.checks.grpo import check_grpo
        check_grpo(spec, data_dir, report, DatasetSummary, tokenizer)
    if config is not None:
        report.predicted_memory = _predicted_memory(spec, config, report)
    report.seconds = time.time() - began
    return report


def _check_gpus(spec: JobSpec, report: PreflightReport) -> None:
    """GPUs this machine can never give the job (a missing GPU, more processes than GPUs); busy
    GPUs are not a problem: the job waits in the queue for them."""
    from jobs.io import gpus
    try:
        gpus.check_request(spec.gpus, spec.processes, gpus.read_gpus())
    except SpecError as exc:
        report.fail(exc.key or "gpus", str(exc).removeprefix(f"{exc.key}: "))


def _check_trackers(spec: JobSpec, report: PreflightReport) -> None:
    """report_to names a tracker whose package is missing: say how to install it."""
    from jobs.spec import trackers
    from jobs.io.tracking import missing_packages
    for name, package in missing_packages(trackers(spec)):
        report.fail("report_to", say("tracker_missing", name=name, package=package))


def _check_model(spec: JobSpec, data_dir, report: PreflightReport, log, model_files: "ModelFiles"
                 ) -> tuple[Any, Any]:
    from jobs.data import encode
    from jobs.models import load as models
    try:
        source = models.resolve_model(spec.model, data_dir, log=log)
        config, tokenizer = model_files.load(source)
    except models.ModelError as exc:
        report.fail("model", str(exc))
        return None, None
    report.model_source = source
    if encode.ensure_chat_template(tokenizer):
        report.chat_template = "ChatML (Fusetune's fallback: the model has no chat template of its own)"
    else:
        report.chat_template = "the model's own"
    if spec.dataset == BUILTIN_DATASET and encode.accepts_system(tokenizer):
        from jobs.data.builtin.identity import system_line
        line = system_line(spec.bot_name, spec.bot_author)
        encode.set_default_system(tokenizer, line)
        report.chat_template += f", with the default system line {line!r}"
    elif spec.dataset == BUILTIN_DATASET:
        report.chat_template += " (it takes no system message: the identity rows go without one)"
    report.max_positions = models.max_positions(config)
    if report.max_positions and spec.max_seq_length > report.max_positions:
        report.fail("max_seq_length", say("seq_over_model_limit", length=spec.max_seq_length,
                                          limit=report.max_positions))
    _check_targets(spec, config, report)
    return config, tokenizer


class ModelFiles:
    """Model configs and tokenizers kept between preflights in one process (the studio's Start):
    loading the tokenizer is most of a warm preflight. The preflight changes nothing of a
    tokenizer but its chat_template (fallback template, default system line), which is put back
    on every hand-out; a model folder whose files changed is loaded again. Not for concurrent
    preflights on one source (the caller serialises them)."""

    def __init__(self, size: int = 2):
        self.size = size
        self._loaded: dict[str, tuple[float, Any, Any, Any]] = {}  # source -> (stamp, config, tokenizer, template)

    def load(self, source: str) -> tuple[Any, Any]:
        from jobs.models import load as models
        stamp = _folder_stamp(source)
        hit = self._loaded.pop(source, None)
        if hit is None or hit[0] != stamp:
            config, tokenizer = models.load_config(source), models.load_tokenizer(source)
            hit = (stamp, config, tokenizer, getattr(tokenizer, "chat_template", None))
        hit[2].chat_template = hit[3]
        if self.size:
            self._loaded[source] = hit   # newest last; the oldest goes first
            while len(self._loaded) > self.size:
                self._loaded.pop(next(iter(self._loaded)))
        return hit[1], hit[2]

    def config(self, source: str) -> Any:
        """The config alone (no tokenizer load when it is not cached)."""
        from jobs.models import load as models
        hit = self._loaded.get(source)
        return hit[1] if hit is not None and hit[0] == _folder_stamp(source) else models.load_config(source)


def _folder_stamp(source: str) -> float:
    """The newest modification time of the files directly in a model folder (0 for a hub id)."""
    import os
    try:
        with os.scandir(source) as entries:
            return max((entry.stat().st_mtime for entry in entries if entry.is_file()), default=0.0)
    except OSError:
        return 0.0


def _check_targets(spec: JobSpec, config, report: PreflightReport) -> None:
    from jobs.models import load as models
    if spec.target_modules == "all-linear" or getattr(config, "vision_config", None) is not None:
        return   # a vision-language model's targets: jobs/checks/vision.py
    try:
        linear = models.linear_module_names(config)
    except models.ModelError as exc:
        report.notes.append(f"target_modules not checked: {exc}")
        return
    missing = models.missing_targets(spec.target_modules, linear)
    if missing:
        leaves = sorted({name.rsplit(".", 1)[-1] for name in linear})
        report.fail("target_modules", say("module_not_linear" if len(missing) == 1 else "modules_not_linear",
                                          names=", ".join(missing), leaves=", ".join(leaves)))


def _check_dataset(spec: JobSpec, key: str, tokenizer, data_dir, report: PreflightReport,
                   limit: int | None) -> None:
    """Read every row, convert every row, and report every bad one (first 10 and the count)."""
    from jobs.data import dataset as data
    from jobs.checks import pair_checks
    if getattr(spec, key) == BUILTIN_CONCISE and not _concise_cached(spec, data_dir, report):
        return
    try:
        rows, problems = _rows(spec, key, tokenizer, data_dir, report, limit)
        if spec.method in PREFERENCE_METHODS:   # preference rows: jobs/checks/pair_checks.py
            return pair_checks.check_pairs(spec, key, rows, problems, tokenizer, report, DatasetSummary)
        refusal = pair_checks.sft_on_preference_rows(spec, rows)
        if refusal:
            return report.fail(key, refusal)
        fmt = spec.dataset_format
        if rows and fmt == "auto":
            fmt = data.detect_format(rows)
        conversations = data.to_conversations(rows, fmt, problems) if rows else []
    except DataError as exc:
        report.fail(key, str(exc))
        return
    error = problems.error(rows.name)
    if error is not None or not rows:
        report.fail(key, str(error) if error else say("no_rows", name=rows.name))
        return
    summary = DatasetSummary(key, rows.name, len(rows), fmt)
    report.datasets.append(summary)
    if tokenizer is not None:
        try:
            _token_stats(summary, tokenizer, conversations, spec.max_seq_length)
        except DataError as exc:
            report.fail(key, str(exc))
            return
        if summary.rows_without_answer == summary.rows:
            report.fail("max_seq_length", say("no_answer_tokens", name=summary.name, length=spec.max_seq_length))


def _rows(spec: JobSpec, key: str, tokenizer, data_dir, report: PreflightReport, limit: int | None):
    """(rows, problems) of the dataset. The built-in identity dataset includes the base model's
    general answers when they are already cached."""
    from jobs.data import dataset as data
    reference = getattr(spec, key)
    if reference == BUILTIN_DATASET:
        rows = _identity_rows(spec, data_dir, report)
        if tokenizer is not None:
            rows = data.identity_for_template(spec, rows, tokenizer, log=lambda _line: None)
        return rows, data.Problems()
    if reference == BUILTIN_CONCISE:
        return data.load_rows(spec, data_dir), data.Problems()
    return data.scan_rows(reference, limit)


def _concise_cached(spec: JobSpec, data_dir, report: PreflightReport) -> bool:
    """Whether builtin:concise's pairs can be read now (its base answers are cached); if not,
    a note says they are made when the job starts."""
    from jobs.data.builtin import general
    from jobs.io import paths
    if report.model_source is not None and general.cached_answers(
            paths.model_cache_dir(paths.data_dir(data_dir)), report.model_source) is not None:
        return True
    report.notes.append(f"{BUILTIN_CONCISE}: the pairs are made from the base model's answers to "
                        f"{len(general.prompts())} general prompts when the job starts (once per model)")
    return False


def _identity_rows(spec: JobSpec, data_dir, report: PreflightReport):
    from jobs.data import dataset as data
    from jobs.io import paths
    from jobs.data.builtin import general
    from jobs.data.builtin import identity
    rows = data.load_rows(spec, data_dir)
    if report.model_source is None:
        return rows
    answers = general.cached_answers(paths.model_cache_dir(paths.data_dir(data_dir)), report.model_source)
    if answers is None:
        report.notes.append(f"the base model's answers to {len(general.prompts())} general prompts are "
                            "generated when the job starts (once per model) and mixed into the identity rows")
        return rows
    mixed = identity.identity_dataset(spec.bot_name, spec.bot_author, answers)
    return data.Rows(mixed, name=rows.name)


def _token_stats(summary: DatasetSummary, tokenizer, conversations: list, max_length: int) -> None:
    """Token lengths and trained tokens per row, over all rows or a seeded sample of them, and the
    Train tab's statistics (jobs/data/stats.py: histogram, cuts, duplicates over every row)."""
    from jobs.data import stats as data_stats
    chosen = conversations
    if len(conversations) > TOKEN_SAMPLE:
        chosen = random.Random(0).sample(conversations, TOKEN_SAMPLE)
        summary.sampled = TOKEN_SAMPLE
    lengths, trained, truncated, empty, measured = [], 0, 0, 0, []
    for conversation in chosen:
        row = data_stats.row_lengths(tokenizer, conversation, max_length)  # untruncated, to measure the cut
        measured.append(row)
        lengths.append(min(row.total, max_length))
        trained += row.answer_kept
        truncated += lengths[-1] >= max_length
        empty += row.answer_kept == 0
    scale = len(conversations) / len(chosen)
    ordered = sorted(lengths)
    summary.tokens = {"min": ordered[0], "mean": round(statistics.fmean(ordered), 1),
                      "p95": ordered[min(len(ordered) - 1, int(0.95 * len(ordered)))], "max": ordered[-1]}
    summary.tokens_total = round(sum(lengths) * scale)
    summary.trained_tokens = round(trained * scale)
    summary.truncated_rows = round(truncated * scale)
    summary.rows_without_answer = round(empty * scale)
    summary.stats = data_stats.length_stats(measured, max_length).as_dict()
    summary.duplicates = data_stats.duplicate_rows(conversations)


def _predicted_memory(spec: JobSpec, config, report: PreflightReport) -> str | None:
    """Hook into jobs/models/fit.py (the peak GPU memory estimate), used only when that module exists."""
    if importlib.util.find_spec("jobs.models.fit") is None:
        return None
    from jobs.models import fit, fit_shard
    try:
        estimate = fit.estimate_peak(spec, config)
        free, _ = fit._cuda_memory()
        gpu_gb = free / 2 ** 30 if free else None
        world = fit_shard.model_world(spec, estimate, gpu_gb)   # a sharded job's budget holds per process
        refusal = fit.budget_refusal(spec, config, world=world)   # no plan can meet it: refused before the job
        if refusal:
            report.fail("max_gpu_memory_gb", refusal)
        planned = fit_shard.for_job(spec, config, estimate, gpu_gb)
        report.notes.extend(planned.notes[len(estimate.notes):])   # sharded per GPU; how many GPUs it needs
        if free is None:   # no GPU here: what the job takes of this machine's RAM (as the Train tab says)
            _ram_note(spec, config, report)
        return planned.summary()
    except (ValueError, AttributeError, KeyError, TypeError) as exc:
        report.notes.append(f"no GPU memory estimate for this model: {exc}")
        return None


def _ram_note(spec: JobSpec, config, report: PreflightReport) -> None:
    from jobs.models.fit_cpu import estimate_ram
    longest = next((d.tokens.get("max") for d in report.datasets if d.key == "dataset"), None)
    try:
        need = estimate_ram(spec, config, longest).allocated_gb
    except (ValueError, AttributeError, KeyError, TypeError):
        return
    report.notes.append(f"on this CPU: about {need:.1f} GiB of RAM at peak (jobs/models/fit_cpu.py)")
