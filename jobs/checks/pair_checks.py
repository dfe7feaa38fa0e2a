"""Preflight for preference data (method dpo / orpo / simpo / kto), and SFT given preference rows.

Refused, naming the rows and the method: a preference method on SFT rows (or KTO on pairs, or a
pair method on KTO rows), SFT on preference rows, a row that cannot be read, an empty answer.
Counted and named as notes (the job still runs): identical chosen and rejected (they teach
nothing: the DPO gradient of such a pair is 0), a pair longer than max_seq_length (cut there)."""
from __future__ import annotations

import random
import statistics

from jobs.messages import say
from jobs.data.conversation import DataError
from jobs.data.pairs import read_preference_rows
from jobs.data.preference import answer_text, is_preference_row, side_tokens
from jobs.spec import PREFERENCE_METHODS

SHOWN = 10
TOKEN_SAMPLE = 2000


def _named(wheres: list[str]) -> str:
    more = f" and {len(wheres) - SHOWN:,} more" if len(wheres) > SHOWN else ""
    return ", ".join(wheres[:SHOWN]) + more


def sft_on_preference_rows(spec, rows) -> str | None:
    """Why SFT cannot train these rows (None when it can): they are preference rows."""
    if spec.method in PREFERENCE_METHODS:
        return None
    found = [where for where, row in zip(rows.wheres, rows) if is_preference_row(row)]
    if not found:
        return None
    return say("sft_got_pairs", name=rows.name, count=len(found), rows=_named(found), method=spec.method)


def check_pairs(spec, key: str, rows, problems, tokenizer, report, summary_type) -> None:
    """Read every row as the method needs it; refusals and notes go into `report`."""
    wheres: list[str] = []
    read = read_preference_rows(rows, spec.method == "kto", spec.method, problems, wheres)
    empty = [w for w, r in zip(wheres, read)
             if not answer_text(r.chosen).strip() or (r.rejected is not None and not answer_text(r.rejected).strip())]
    for where in empty:
        problems.add(say("row_problem", where=where, problem=say("answer_empty")), 0)
    error = problems.error(rows.name)
    if error is not None or not rows:
        report.fail(key, str(error) if error else say("no_rows", name=rows.name))
        return
    same = [w for w, r in zip(wheres, read) if r.rejected is not None and r.chosen == r.rejected]
    if same:
        report.notes.append(f"{key}: {len(same):,} pairs have identical chosen and rejected answers "
                            f"({_named(same)}); they teach nothing")
    summary = summary_type(key, rows.name, len(rows), f"preference ({spec.method})")
    report.datasets.append(summary)
    if tokenizer is not None:
        try:
            _lengths(summary, tokenizer, read, wheres, spec.max_seq_length, key, report)
        except DataError as exc:
            report.fail(key, str(exc))


def _lengths(summary, tokenizer, read, wheres, max_length: int, key: str, report) -> None:
    """Tokens of each row's longest side (prompt + answer) for the length statistics, and the
    tokens and answer tokens of both sides as training cuts them, over all rows or a seeded sample."""
    picked = list(range(len(read)))
    if len(picked) > TOKEN_SAMPLE:
        picked = sorted(random.Random(0).sample(picked, TOKEN_SAMPLE))
        summary.sampled = TOKEN_SAMPLE
    sides = [side_tokens(tokenizer, read[i]) for i in picked]   # uncut
    lengths = [max(total for total, _ in row) for row in sides]
    kept = [side_tokens(tokenizer, read[i], max_length) for i in picked]   # as training cuts them
    over = [wheres[i] for i, n in zip(picked, lengths) if n > max_length]
    ordered = sorted(lengths)
    summary.tokens = {"min": ordered[0], "mean": round(statistics.fmean(ordered), 1),
                      "p95": ordered[min(len(ordered) - 1, int(0.95 * len(ordered)))], "max": ordered[-1]}
    scale = len(read) / len(picked)
    summary.tokens_total = round(sum(total for row in kept for total, _ in row) * scale)
    summary.trained_tokens = round(sum(answer for row in kept for _, answer in row) * scale)
    summary.truncated_rows = round(len(over) * len(read) / len(picked))
    if over:
        report.notes.append(f"{key}: {summary.truncated_rows:,} rows are longer than max_seq_length={max_length} "
                            f"({_named(over)}{', sampled' if summary.sampled else ''}); they are cut there")
