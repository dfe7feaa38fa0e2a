"""(jobs/checks) Dataset statistics shown before Start: how long the rows are (prompt and answer, in
tokens, as a histogram), how many rows max_seq_length cuts and by how much (and whether the cut
takes answer tokens, which is lost training signal), exact duplicate rows, and the share of tokens
that are trained. Computed by the preflight (jobs/preflight._token_stats) from the rows exactly as
training encodes them, untruncated, so the cut can be measured.

The idea of looking at the length distribution against the cut-off before training comes from
LLaMA-Factory's `cal_ppl`/`length_cdf` scripts and TRL's truncation warnings; the code is ours."""
from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass, field
from typing import Any

from jobs.data.encode import IGNORE_INDEX

HISTOGRAM_BINS = 12
UNLIMITED = 1 << 40  # encode without truncation


@dataclass
class RowLengths:
    """One row untruncated: its prompt (untrained) and answer (trained) tokens, and how many of its
    answer tokens fall within max_seq_length."""

    total: int
    answer: int
    answer_kept: int

    @property
    def prompt(self) -> int:
        return self.total - self.answer


def row_lengths(tokenizer, conversation, max_length: int) -> RowLengths:
    from jobs.data.encode import encode
    example = encode(tokenizer, conversation, UNLIMITED)
    trained = [label != IGNORE_INDEX for label in example.labels]
    return RowLengths(len(example.input_ids), sum(trained), sum(trained[:max_length]))


@dataclass
class LengthStats:
    max_seq_length: int
    rows: int                                   # rows measured (a sample when `sampled`)
    truncated_rows: int = 0                     # longer than max_seq_length
    cut_tokens_mean: float = 0.0                # tokens cut from a truncated row, on average
    cut_tokens_max: int = 0
    answers_cut_rows: int = 0                   # truncated rows that lose answer tokens
    answer_tokens_cut: int = 0
    trained_share: float = 0.0                  # trained tokens / all tokens, within max_seq_length
    edges: list[int] = field(default_factory=list)     # histogram bin edges (tokens), len = bins + 1
    prompt_counts: list[int] = field(default_factory=list)
    answer_counts: list[int] = field(default_factory=list)

    def as_dict(self) -> dict[str, Any]:
        return dict(vars(self))


def length_stats(lengths: list[RowLengths], max_length: int) -> LengthStats:
    """The statistics of measured rows against max_seq_length."""
    stats = LengthStats(max_seq_length=max_length, rows=len(lengths))
    cuts = [row.total - max_length for row in lengths if row.total > max_length]
    stats.truncated_rows = len(cuts)
    if cuts:
        stats.cut_tokens_mean = round(sum(cuts) / len(cuts), 1)
        stats.cut_tokens_max = max(cuts)
    lost = [row.answer - row.answer_kept for row in lengths if row.answer_kept < row.answer]
    stats.answers_cut_rows, stats.answer_tokens_cut = len(lost), sum(lost)
    kept = sum(min(row.total, max_length) for row in lengths)
    stats.trained_share = round(sum(row.answer_kept for row in lengths) / kept, 4) if kept else 0.0
    stats.edges = histogram_edges(max([row.total for row in lengths] + [1]), max_length)
    stats.prompt_counts = _counts([row.prompt for row in lengths], stats.edges)
    stats.answer_counts = _counts([row.answer for row in lengths], stats.edges)
    return stats


def histogram_edges(longest: int, max_length: int, bins: int = HISTOGRAM_BINS) -> list[int]:
    """Equal-width bins from 0 that cover the longest row, with max_seq_length on an edge when it is
    within the range (so the bars beyond the cut are exactly the truncated lengths)."""
    top = max(longest, 1)
    if max_length < top:
        inside = max(1, min(bins - 1, round(bins * max_length / top)))
        width = max(1, -(-max_length // inside))
        edges = [min(i * width, max_length) for i in range(inside)] + [max_length]
        step = max(1, -(-(top - max_length) // (bins - inside)))
        edges += [max_length + step * i for i in range(1, bins - inside + 1)]
        edges[-1] = max(edges[-1], top + 1)
        return sorted(set(edges))
    width = max(1, -(-(top + 1) // bins))
    return [i * width for i in range(bins + 1)]


def _counts(values: list[int], edges: list[int]) -> list[int]:
    counts = [0] * (len(edges) - 1)
    for value in values:
        for i in range(len(counts)):
            if value < edges[i + 1] or i == len(counts) - 1:
                counts[i] += 1
                break
    return counts


def duplicate_rows(conversations: list) -> int:
    """Rows that repeat an earlier row exactly (same messages, same text)."""
    seen, duplicates = set(), 0
    for conversation in conversations:
        key = hashlib.sha1(json.dumps(conversation, ensure_ascii=False, sort_keys=True).encode()).digest()
        duplicates += key in seen
        seen.add(key)
    return duplicates
