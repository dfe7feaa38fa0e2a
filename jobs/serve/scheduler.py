"""The queue between the HTTP handlers and the model: one thread owns the model and runs batch after
batch; each batch is formed, when the previous one ends, from the requests waiting then.

Batch-at-a-time, not continuous batching: the decode loop (jobs/train/decode.py) keeps one static KV
cache whose rows all start decoding at the same step, so a request that arrives while a batch runs
joins the next batch, not the running one (vLLM/TGI's continuous batching would admit it at the next
decode step; that needs per-row cache slots the loop does not have). Requests share a batch when they
ask for the same model id and the same temperature and top_p; a seeded request runs alone, so its seed
alone decides its answer. Each row stops on its own (EOS, stop strings, max_tokens), and the batch
ends when its last row does.

The queue is bounded: `submit` raises QueueFull (HTTP 429) when `max_waiting` requests already wait."""
from __future__ import annotations

import itertools
import sys
import threading
import traceback
from collections import deque
from dataclasses import dataclass, field
from typing import Callable

from jobs.serve.rows import Row, Sampling

MAX_WAITING = 64       # requests waiting for a batch; more answer 429
MAX_BATCH_ROWS = 32    # answers generated together in one batch (a request's n answers count each)
_ids = itertools.count()


class QueueFull(Exception):
    pass


@dataclass
class Generation:
    """One request: its answers (rows), how to sample, and where its progress goes.

    `sink(events)` is called from the scheduler thread with a list of events:
    ("delta", index, text, finish_reason or None, completion_tokens), ("error", message), ("end",)."""

    model_id: str
    adapter: str | None
    tokenizer: object
    rows: list[Row]
    sampling: Sampling
    sink: Callable[[list[tuple]], None]
    cancelled: threading.Event = field(default_factory=threading.Event)
    serial: int = field(default_factory=lambda: next(_ids))

    @property
    def batch_key(self) -> tuple:
        alone = self.serial if self.sampling.seed is not None else None
        return self.model_id, self.sampling.temperature, self.sampling.top_p, alone


class Scheduler:
    def __init__(self, engine, max_waiting: int = MAX_WAITING, max_batch_rows: int = MAX_BATCH_ROWS):
        self.engine, self.max_waiting, self.max_batch_rows = engine, max_waiting, max_batch_rows
        self._waiting: deque[Generation] = deque()
        self._cond = threading.Condition()
        self._stopped = False
        self.batches = 0
        self._thread = threading.Thread(target=self._loop, name="fusetune-serve-batches", daemon=True)
        self._thread.start()

    def submit(self, generation: Generation) -> None:
        with self._cond:
            if len(self._waiting) >= self.max_waiting:
                raise QueueFull(f"{self.max_waiting} requests are already waiting; retry shortly")
            self._waiting.append(generation)
            self._cond.notify()

    def stop(self) -> None:
        with self._cond:
            self._stopped = True
            self._cond.notify()

    def _loop(self) -> None:
        while True:
            with self._cond:
                while not self._waiting and not self._stopped:
                    self._cond.wait()
                if self._stopped:
                    return
                batch = self._take_batch()
            self._run(batch)

    def _take_batch(self) -> list[Generation]:
        """The oldest waiting request and every later one that can share its batch, in arrival order."""
        first = self._waiting.popleft()
        batch, rows = [first], len(first.rows)
        for other in list(self._waiting):
            if other.batch_key == first.batch_key and rows + len(other.rows) <= self.max_batch_rows:
                self._waiting.remove(other)
                batch.append(other)
                rows += len(other.rows)
        return batch

    def _run(self, batch: list[Generation]) -> None:
        rows = [row for g in batch for row in g.rows]
        self.batches += 1
        try:
            self.engine.run(rows, batch[0].sampling, batch[0].adapter, batch[0].tokenizer,
                            on_column=lambda _: self._report(batch),
                            cancelled=lambda: all(g.cancelled.is_set() for g in batch))
        except Exception as exc:   # noqa: BLE001 - a failed batch answers its requests, the server lives on
            traceback.print_exc(file=sys.stderr)
            for g in batch:
                g.sink([("error", f"generation failed: {type(exc).__name__}: {exc}")])
            return
        self._report(batch)
        for g in batch:
            g.sink([("end",)])

    @staticmethod
    def _report(batch: list[Generation]) -> None:
        for g in batch:
            if g.cancelled.is_set():
                for row in g.rows:
                    row.finish_reason = row.finish_reason or "cancelled"
                continue
            events = []
            for row in g.rows:
                text = row.new_text()
                finished = row.done and not row.reported
                if text or finished:
                    events.append(("delta", row.index, text, row.finish_reason if finished else None,
                                   len(row.tokens)))
                if finished:
                    row.reported = True
            if events:
                g.sink(events)
