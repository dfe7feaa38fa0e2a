"""Tokenized examples of a dataset file, built once as a stream and kept on disk.

Why: templating and tokenizing every row in the trainer's memory before step 1 (a list of Python
Examples) costs minutes and gigabytes for a dataset of 800k rows, and a second job pays it again.
Here the rows are read as a stream (jobs/data/readers.py, bounded per row), turned into
conversations in chunks, templated and tokenized in worker processes, and appended to flat int32
files under <data dir>/cache/tokenized/<key>/ (input_ids, labels, and the examples' offsets). The key
hashes the file's content, the chat template, the tokenizer, max_seq_length, the format and the row
limit, so a second job on the same data opens the folder in milliseconds (train.log says so).

The trainer then holds a `TokenStore`: the files memory-mapped, an Example built only when a batch
asks for it (memory bounded by the batches, not the file), and the lengths precomputed for packing
and length grouping (jobs/data/packing.py BatchPlan uses `lengths`). The idea is the `datasets`
library's Arrow cache (fingerprint + memory map); flat numpy files do the same for two integer
columns with O(1) row access and no dependency. Bad rows are still all named at the end, by number,
and nothing is kept then (a folder appears only complete: written under a temporary name, renamed)."""
from __future__ import annotations

import collections
import contextlib
import fcntl
import hashlib
import json
import multiprocessing
import os
import time
from pathlib import Path

import numpy as np

from jobs.messages import say
from jobs.data import encode, first_rows
from jobs.data.dataset import Problems, Rows, detect_format, load_conversations, object_rows, to_conversations
from jobs.data.readers import max_row_bytes
from jobs.data.encode import DataError, Example
from jobs.data.fast_template import Encoder
from jobs.io import paths, phases
from jobs.io.storage import make_private_dir
from jobs.spec import BUILTIN_DATASET, DATASET_SUFFIXES, JobSpec, is_local_reference

CACHE_VERSION = 1          # bump when encoding changes what a row becomes
CHUNK_ROWS = 2000          # rows a worker templates and tokenizes at a time
PROGRESS_EVERY_S = 2.0     # seconds between progress lines / phase events
SMALL_ROWS, SMALL_BYTES = 20_000, 8 << 20   # below either, one process: workers cost more than they save


def tokenized_examples(spec: JobSpec, tokenizer, data_dir=None, log=print, events=None, processes: int = 1,
                       device_type: str = "cpu"):
    """The job's training examples: a TokenStore for a dataset file (built on first use, then
    reused), or only the rows its steps use when it needs few of a big file's rows and the cache is
    not built yet (jobs/data/first_rows.py), else (the built-in or a hub dataset) a list of Examples."""
    if spec.dataset == BUILTIN_DATASET or not is_local_reference(spec.dataset, DATASET_SUFFIXES):
        conversations = load_conversations(spec, tokenizer, data_dir, log=log)   # reports "preparing data"
        phases.report(phases.TOKENIZING)
        return encode.encode_all(tokenizer, conversations, spec.max_seq_length, log=log)
    path = Path(spec.dataset).expanduser()
    if not path.is_file():
        raise DataError(say("no_such_data_file", reference=spec.dataset))
    phases.report(phases.TOKENIZING)   # the build adds its counts as it goes
    started = time.monotonic()
    folder = tokenized_root(data_dir) / cache_key(path, spec, tokenizer)
    if not (folder / "meta.json").is_file() and path.stat().st_size >= SMALL_BYTES:
        needed = first_rows.rows_needed(spec, processes, device_type)
        total = estimate_rows(path) if needed else None
        sampled = (first_rows.sampled_examples(path, spec, tokenizer, needed, total, log)
                   if first_rows.worth_sampling(needed, total) else None)
        if sampled is not None:
            return sampled
    with _locked(folder.with_name(folder.name + ".lock")):   # two jobs (or ranks) build it once
        if (folder / "meta.json").is_file():
            store = TokenStore.open(folder)
            log(f"tokenized cache: reusing {folder.name[:12]} ({len(store):,} examples, "
                f"{time.monotonic() - started:.1f} s)")
            return store
        log(f"tokenizing {path.name} into the cache (once per file, template and tokenizer)")
        build(path, spec, tokenizer, folder, log, events)
    store = TokenStore.open(folder)
    log(f"tokenized {len(store):,} examples in {time.monotonic() - started:.1f} s")
    return store


def tokenized_root(data_dir=None) -> Path:
    return make_private_dir(paths.cache_dir(paths.data_dir(data_dir)) / "tokenized")


def cache_key(path: Path, spec: JobSpec, tokenizer) -> str:
    """sha256 of everything that decides what the rows become."""
    digest = hashlib.sha256()
    with open(path, "rb") as fh:
        for block in iter(lambda: fh.read(1 << 20), b""):
            digest.update(block)
    parts = {"version": CACHE_VERSION, "file": digest.hexdigest(), "template": tokenizer.chat_template,
             "tokenizer": _tokenizer_fingerprint(tokenizer), "max_seq_length": spec.max_seq_length,
             "format": spec.dataset_format, "row_limit": max_row_bytes(), "suffix": path.suffix.lower()}
    return hashlib.sha256(json.dumps(parts, sort_keys=True, default=str).encode()).hexdigest()


def _tokenizer_fingerprint(tokenizer) -> str:
    backend = getattr(tokenizer, "backend_tokenizer", None)
    text = backend.to_str() if backend is not None else json.dumps(tokenizer.get_vocab(), sort_keys=True)
    specials = [tokenizer.eos_token_id, tokenizer.bos_token_id, tokenizer.pad_token_id]
    return hashlib.sha256((text + repr(specials)).encode()).hexdigest()


@contextlib.contextmanager
def _locked(lock_path: Path):
    fd = os.open(lock_path, os.O_RDWR | os.O_CREAT, 0o600)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        yield
    finally:
        fcntl.flock(fd, fcntl.LOCK_UN)
        os.close(fd)


class TokenStore:
    """Examples by index over memory-mapped token files; `lengths` without touching the tokens."""

    def __init__(self, ids: np.ndarray, labels: np.ndarray, offsets: np.ndarray, index: np.ndarray | None = None):
        self._ids, self._labels, self._offsets = ids, labels, offsets
        self._index = np.arange(len(offsets) - 1) if index is None else np.asarray(index, dtype=np.int64)
        self.lengths = (offsets[1:] - offsets[:-1])[self._index].tolist()

    @classmethod
    def open(cls, folder: Path) -> "TokenStore":
        offsets = np.load(folder / "offsets.npy")
        total = int(offsets[-1])
        ids = np.memmap(folder / "input_ids.bin", dtype=np.int32, mode="r", shape=(total,)) if total else np.zeros(0, np.int32)
        labels = np.memmap(folder / "labels.bin", dtype=np.int32, mode="r", shape=(total,)) if total else ids
        return cls(ids, labels, offsets)

    def __len__(self) -> int:
        return len(self._index)

    def __getitem__(self, i: int) -> Example:
        row = int(self._index[i])
        start, end = int(self._offsets[row]), int(self._offsets[row + 1])
        return Example(self._ids[start:end].tolist(), self._labels[start:end].tolist())

    def __iter__(self):
        return (self[i] for i in range(len(self)))

    def subset(self, positions) -> "TokenStore":
        """The examples at these positions of this store, in that order (a view, no copy of tokens)."""
        return TokenStore(self._ids, self._labels, self._offsets, self._index[np.asarray(positions, dtype=np.int64)])


# ---- building ---------------------------------------------------------------------------------
_WORKER: dict = {}   # what this process (or a pool worker) encodes with


def build(path: Path, spec: JobSpec, tokenizer, folder: Path, log=print, events=None) -> None:
    """Stream `path` into `folder` (module doc); DataError naming the bad rows, and no folder, if any."""
    temp = folder.with_name(f"{folder.name}.tmp{os.getpid()}")
    make_private_dir(temp)
    try:
        counts = _write_tokens(path, spec, tokenizer, temp, log, events)
        meta = {"source": path.name, "examples": counts["kept"], "rows": counts["rows"],
                "dropped": counts["dropped"], "version": CACHE_VERSION, "max_seq_length": spec.max_seq_length}
        (temp / "meta.json").write_text(json.dumps(meta))
        os.replace(temp, folder)
    finally:
        if temp.exists():
            for child in temp.iterdir():
                child.unlink()
            temp.rmdir()


def _write_tokens(path: Path, spec: JobSpec, tokenizer, temp: Path, log, events) -> dict:
    problems, lengths = Problems(), []
    counts = {"rows": 0, "kept": 0, "dropped": 0}
    total = estimate_rows(path)
    progress = _Progress(log, events, total)
    _init_worker(tokenizer, spec.max_seq_length)
    small = total is not None and total < SMALL_ROWS or path.stat().st_size < SMALL_BYTES
    workers = 1 if small else max(1, min(len(os.sched_getaffinity(0)), 8))
    with open(temp / "input_ids.bin", "wb") as ids_out, open(temp / "labels.bin", "wb") as labels_out, \
            _pool(workers, tokenizer, spec.max_seq_length) as pool:
        pending: collections.deque = collections.deque()

        def take_one() -> None:
            ids, labels, kept_lengths, dropped = pending.popleft().get()
            ids_out.write(ids.tobytes())
            labels_out.write(labels.tobytes())
            lengths.append(kept_lengths)
            counts["kept"] += len(kept_lengths)
            counts["dropped"] += dropped
            progress.update(counts["kept"] + counts["dropped"])

        for conversations in conversation_chunks(path, spec, problems, counts):
            if problems.count:    # keep reading to name every bad row, but stop encoding
                continue
            pending.append(pool.apply_async(encode_chunk, (conversations,)) if pool else _Done(encode_chunk(conversations)))
            while len(pending) > 2 * workers:   # bounded: a few chunks in flight, never the file
                take_one()
        while pending:
            take_one()
    progress.finish(counts["kept"] + counts["dropped"])
    _check_counts(path, spec, problems, counts, log)
    offsets = np.zeros(counts["kept"] + 1, dtype=np.int64)
    if lengths:
        np.cumsum(np.concatenate(lengths), out=offsets[1:])
    np.save(temp / "offsets.npy", offsets)
    return counts


def _check_counts(path: Path, spec: JobSpec, problems: Problems, counts: dict, log) -> None:
    error = problems.error(path.name)
    if error:
        raise error
    if not counts["rows"]:
        raise DataError(say("no_rows", name=path.name))
    if not counts["kept"]:
        raise DataError(say("no_row_answer_tokens", length=spec.max_seq_length))
    if counts["dropped"]:
        log(f"warning: {counts['dropped']} of {counts['rows']} rows have no answer tokens within "
              f"max_seq_length={spec.max_seq_length} and are skipped; raise max_seq_length to keep them")


class _Done:
    """A finished result with AsyncResult's get(), for the one-process path."""

    def __init__(self, value):
        self.value = value

    def get(self):
        return self.value


def _init_worker(tokenizer, max_length: int) -> None:
    _WORKER.clear()
    _WORKER.update(tokenizer=tokenizer, max_length=max_length)


@contextlib.contextmanager
def _pool(workers: int, tokenizer, max_length: int):
    """Worker processes, spawned (not forked: the trainer has threads by now, and a fork can copy a
    lock one of them holds, which hung a worker), each given the tokenizer once."""
    if workers < 2:
        yield None
        return
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")   # the workers are the parallelism
    pool = multiprocessing.get_context("spawn").Pool(workers, initializer=_init_worker,
                                                     initargs=(tokenizer, max_length))
    try:
        yield pool
    finally:
        pool.terminate()
        pool.join()


def conversation_chunks(path: Path, spec: JobSpec, problems: Problems, counts: dict):
    """Lists of up to CHUNK_ROWS conversations, in file order; bad rows go to `problems`."""
    fmt, chunk = spec.dataset_format, Rows(name=path.name)
    for number, value, where in object_rows(path, problems, counts):
        if fmt == "auto":
            fmt = detect_format([value])
        chunk.append(value)
        chunk.numbers.append(number)
        chunk.wheres.append(where)
        if len(chunk) >= CHUNK_ROWS:
            yield to_conversations(chunk, fmt, problems)
            chunk = Rows(name=path.name)
    if chunk:
        yield to_conversations(chunk, fmt, problems)


def encode_chunk(conversations: list) -> tuple[np.ndarray, np.ndarray, np.ndarray, int]:
    """(input_ids, labels flat, lengths of the kept examples, rows dropped for no answer tokens)."""
    if "encoder" not in _WORKER:   # one per worker process, its per-shape templates kept between chunks
        _WORKER["encoder"] = Encoder(_WORKER["tokenizer"], _WORKER["max_length"])
    ids, labels, lengths, dropped = [], [], [], 0
    for example in _WORKER["encoder"].encode_many(conversations):
        if example.trained_tokens == 0:
            dropped += 1
            continue
        ids += example.input_ids
        labels += example.labels
        lengths.append(len(example.input_ids))
    return (np.asarray(ids, dtype=np.int32), np.asarray(labels, dtype=np.int32),
            np.asarray(lengths, dtype=np.int64), dropped)


def estimate_rows(path: Path) -> int | None:
    """Rows in the file, cheaply: Parquet's metadata, lines of JSONL/CSV; None for a JSON array."""
    suffix = path.suffix.lower()
    if suffix == ".parquet":
        try:
            import pyarrow.parquet as pq
            return pq.ParquetFile(path).metadata.num_rows
        except Exception:  # an unreadable file is named by the reader, not here
            return None
    if suffix not in (".jsonl", ".csv"):
        return None
    with open(path, "rb") as fh:
        lines = sum(block.count(b"\n") for block in iter(lambda: fh.read(1 << 20), b""))
    return max(0, lines - (1 if suffix == ".csv" else 0))


class _Progress:
    """Progress to train.log and as phase events, at most every PROGRESS_EVERY_S seconds."""

    def __init__(self, log, events, total: int | None):
        self.log, self.events, self.total = log, events, total
        self.started = self.last = time.monotonic()
        self._emit(0)

    def update(self, done: int) -> None:
        now = time.monotonic()
        if now - self.last >= PROGRESS_EVERY_S:
            self.last = now
            share = f" of {self.total:,} ({done / self.total:.0%})" if self.total else ""
            self.log(f"  tokenizing: {done:,} rows{share}, {done / max(1e-9, now - self.started):,.0f} rows/s")
            self._emit(done)

    def finish(self, done: int) -> None:
        self.total = done
        self._emit(done)

    def _emit(self, done: int) -> None:
        if self.events is not None:
            self.events.emit("phase", phase="tokenizing", done=done, total=self.total)
