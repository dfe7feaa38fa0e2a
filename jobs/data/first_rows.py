"""The rows a job's steps will use, tokenized alone: a big dataset file reaches step 1 without
tokenizing every row first (issue 40 item 11).

A job with max_steps uses at most max_steps x batch_size x gradient_accumulation_steps x processes
examples. Building the whole tokenized cache (jobs/data/cache.py) of a 200 MB chat file costs ~160
CPU seconds on this project's 2-core machine, 80 % of them templating and tokenizing rows the job
never reaches: with the default 60 steps, 240 of 804,356. Here, when the cache does not exist yet and
the job needs few of the file's rows, every row is still read and checked (the same row-level
refusals as the full build and the preflight: a bad row anywhere stops the job before step 1, named
by number), but only a seeded sample of the rows the steps need is kept and tokenized (TRL and
LLaMA-Factory's `max_samples` / streaming datasets trade the same way; here the sample is uniform over
the file, as the full path's shuffle is). The cache is not built by such a job: a later job with more
steps or epochs builds it as before."""
from __future__ import annotations

import random
from pathlib import Path

from jobs.data import encode
from jobs.data.dataset import Problems, Rows, detect_format, object_rows, to_conversations
from jobs.data.encode import DataError
from jobs.io import phases
from jobs.messages import say
from jobs.spec import JobSpec

CHUNK_ROWS = 2000   # rows converted (checked) at a time
SPARE = 1.1         # rows sampled over the need: a few may have no answer tokens within max_seq_length
WORTH_IT = 4        # sample only when the file holds at least this many times the rows needed


def rows_needed(spec: JobSpec, processes: int = 1, device_type: str = "cpu") -> int | None:
    """The examples this job's steps can use, or None when it may use every row (a run of epochs,
    an eval share of the data, or packing: a packed row holds an unknown number of examples, and
    `auto` packs on a GPU, jobs/data/packing.py resolve_packing)."""
    packs = spec.packing == "on" or (spec.packing == "auto" and device_type == "cuda")
    if spec.max_steps <= 0 or spec.eval_fraction > 0 or packs:
        return None
    return spec.max_steps * spec.batch_size * spec.gradient_accumulation_steps * max(1, processes)


def worth_sampling(needed: int | None, total_rows: int | None) -> bool:
    return needed is not None and total_rows is not None and needed * WORTH_IT <= total_rows


def sample_numbers(total_rows: int, needed: int, seed: int) -> set[int]:
    """Row numbers (1-based, as readers number them) of a seeded uniform sample."""
    count = min(total_rows, int(needed * SPARE) + 1)
    return set(random.Random(seed).sample(range(1, total_rows + 1), count))


def sampled_examples(path: Path, spec: JobSpec, tokenizer, needed: int, total_rows: int, log=print) -> list | None:
    """Every row of `path` checked; the sampled ones tokenized. DataError naming the bad rows, if any;
    None when the sample holds fewer examples than the steps need (rows without answer tokens within
    max_seq_length, or fewer rows than the file's line count said): the caller tokenizes every row."""
    wanted = sample_numbers(total_rows, needed, spec.seed)
    picked, problems, fmt, rows = _read_checked(path, spec.dataset_format, wanted, total_rows)
    error = problems.error(path.name)
    if error:
        raise error
    if not rows:
        raise DataError(say("no_rows", name=path.name))
    conversations = to_conversations(picked, fmt)
    examples = [e for e in (encode.encode(tokenizer, c, spec.max_seq_length) for c in conversations)
                if e.trained_tokens > 0]
    if len(examples) < needed:
        log(f"{path.name}: only {len(examples):,} of the {len(picked):,} sampled rows have answer tokens within "
            f"max_seq_length={spec.max_seq_length}; tokenizing every row instead")
        return None
    log(f"{path.name}: {rows:,} rows read and checked; the job's {spec.max_steps} steps use {needed:,} "
        f"examples, so a seeded sample of {len(examples):,} was tokenized (not the whole file: "
        "num_epochs or eval_fraction use every row)")
    return examples


def _read_checked(path: Path, fmt: str, wanted: set[int], total_rows: int) -> tuple[Rows, Problems, str, int]:
    """(the wanted rows, every bad row's problem, the format, rows read): every row converted once."""
    phases.report(phases.TOKENIZING, 0, total_rows, "rows")
    problems, picked, chunk, counts = Problems(), Rows(name=path.name), Rows(name=path.name), {"rows": 0}
    for number, value, where in object_rows(path, problems, counts):
        if fmt == "auto":
            fmt = detect_format([value])
        for rows_of in (chunk, picked) if number in wanted else (chunk,):
            rows_of.append(value)
            rows_of.numbers.append(number)
            rows_of.wheres.append(where)
        if len(chunk) >= CHUNK_ROWS:
            to_conversations(chunk, fmt, problems)   # checked; only the sample is kept
            chunk = Rows(name=path.name)
            phases.report(phases.TOKENIZING, counts["rows"], total_rows, "rows")
    if chunk:
        to_conversations(chunk, fmt, problems)
    return picked, problems, fmt, counts["rows"]

