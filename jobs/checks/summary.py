"""The readable summary of a preflight report (what `python -m jobs.train CONFIG --dry-run` prints)."""
from __future__ import annotations

import math
from typing import TYPE_CHECKING

from jobs.io.gpus import read_gpus

if TYPE_CHECKING:
    from jobs.checks.preflight import DatasetSummary, PreflightReport

WIDTH = 15


def _line(label: str, text: str) -> str:
    return f"  {label:<{WIDTH}}{text}"


def summary_text(report: "PreflightReport") -> str:
    spec = report.spec
    verdict = "ok" if report.ok else f"{len(report.problems)} problem(s): this job would not start"
    lines = [f"preflight: {verdict} ({report.seconds:.1f}s)"]
    model = spec.model if report.model_source in (None, spec.model) else f"{spec.model} -> {report.model_source}"
    if report.max_positions:
        model += f" (up to {report.max_positions:,} positions)"
    lines.append(_line("model", model))
    if report.chat_template:
        lines.append(_line("chat template", report.chat_template))
    for summary in report.datasets:
        lines += _dataset_lines(summary, spec.max_seq_length)
    train = next((d for d in report.datasets if d.key == "dataset"), None)
    if train is not None:
        lines.append(_line("this run", _run_text(spec, train)))
    lines.append(_line("GPU memory", _gpu_memory_text(report.predicted_memory)))
    lines += [_line("note", note) for note in report.notes]
    if report.problems:
        lines.append("problems:")
        lines += [f"  {problem}" for problem in report.problems]
    return "\n".join(lines)


def _gpu_memory_text(predicted: str | None) -> str:
    """The predicted GPU peak; on a machine without a GPU, first that the job runs on the CPU (a GPU
    peak printed alone there reads as this machine's need)."""
    text = predicted or "no estimate (jobs/models/fit.py is not available)"
    if read_gpus():
        return text
    return "none on this machine: the job runs on the CPU" + (f" (on a GPU: {predicted})" if predicted else "")


def _dataset_lines(summary: "DatasetSummary", max_seq_length: int) -> list[str]:
    lines = [_line(summary.key, f"{summary.name}: {summary.rows:,} rows ({summary.format})")]
    if not summary.tokens:
        return lines
    t = summary.tokens
    over = "all rows" if summary.sampled is None else f"a sample of {summary.sampled:,} rows"
    lines.append(_line("", f"tokens per row: min {t['min']:,}, mean {t['mean']:,}, p95 {t['p95']:,}, "
                           f"max {t['max']:,} ({over})"))
    estimate = "" if summary.sampled is None else "about "
    lines.append(_line("", f"{estimate}{summary.tokens_total:,} tokens, {summary.trained_tokens:,} of them "
                           "trained (answers), per pass over the data"))
    if summary.truncated_rows:
        lines.append(_line("", f"{summary.truncated_rows:,} rows reach max_seq_length={max_seq_length} and "
                               "are cut there"))
    cut = summary.stats.get("answers_cut_rows", 0)
    if cut:
        lines.append(_line("", f"{cut:,} rows lose answer tokens to that cut "
                               f"({summary.stats['answer_tokens_cut']:,} answer tokens in all)"))
    if summary.duplicates:
        lines.append(_line("", f"{summary.duplicates:,} rows repeat an earlier row exactly"))
    if summary.rows_without_answer:
        lines.append(_line("", f"{summary.rows_without_answer:,} rows have no answer within max_seq_length "
                               "and are skipped; raise max_seq_length to keep them"))
    return lines


def _run_text(spec, train: "DatasetSummary") -> str:
    per_step = spec.batch_size * spec.gradient_accumulation_steps
    usable = max(1, train.rows - train.rows_without_answer)
    if spec.max_steps > 0:
        steps = spec.max_steps
    else:
        steps = max(1, math.ceil(math.ceil(usable / spec.batch_size) / spec.gradient_accumulation_steps
                                 * spec.num_epochs))
    epochs = steps * per_step / usable
    trained = round(train.trained_tokens / max(1, train.rows) * steps * per_step)
    return (f"{steps:,} steps x {per_step:,} rows = {steps * per_step:,} rows ({epochs:.2f} passes over the "
            f"data), about {trained:,} trained tokens")
