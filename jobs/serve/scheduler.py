"""The queue between the HTTP handlers and the model: one thread owns the model and runs one batch
at a time, a decode step at a time, with continuous batching (vLLM/TGI's in-flight batching):

- A batch holds requests for the same model id (adapter) and the same temperature and top_p. A
  request that arrives while it decodes joins it before the next decode step: its prompt is
  prefilled, then it decodes alongside (engine.py: slots.py's CUDA-graph cache on the GPU,
  batch.py's DynamicCache on the CPU). A row that finishes (EOS, a stop string, max_tokens, the
  client gone) leaves at once and frees its slot; a request ends when its last row does, without
  waiting for the rest of the batch.
- At most `max_batch_rows` rows decode together (a request's n answers count each); a request that
  does not fit waits. Joining stops at the first waiting request that cannot share the batch, so a
  stream of same-model requests never starves a request for another model: the batch drains, and
  the next batch starts with the oldest waiting request and every waiting one that can share it.
- A seeded request runs alone, so its seed alone decides its answer; the engine may refuse a join
  (`engine.can_join`: no free slot, no room in the GPU cache, a model whose cache is not joinable),
  and the request waits.
- The queue is bounded: `submit` raises QueueFull (HTTP 429) when `max_waiting` requests already wait.

- A batch whose CUDA graph is worth keeping (`batch.reusable`: slots.py's) is kept for `keep_idle_s`
  (IDLE_KEEP_S)
  after its last request ends, up to MAX_IDLE of them (one per model and sampling: a chat beside the
  base model alternates two). The next request that shares its key and fits its cache reuses it
  instead of opening (and capturing) a new one; an unseeded request only, as a seeded one runs alone.

`batches` (opened), `joins` (requests admitted into a batch already decoding), `reuses` (batches
taken back from idle) and `steps` (decode steps) count what happened, for /health and the tests."""
from __future__ import annotations

import itertools
import sys
import threading
import time
import traceback
from collections import OrderedDict, deque
from dataclasses import dataclass, field
from typing import Callable

from jobs.serve.rows import Row, Sampling

MAX_WAITING = 64       # requests waiting for a batch; more answer 429
MAX_BATCH_ROWS = 32    # answers generated together in one batch (a request's n answers count each)
IDLE_KEEP_S = 120.0    # how long a finished reusable batch (and its cache's memory) waits for the next request
MAX_IDLE = 2           # finished batches kept at once, the least recently used dropped first
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

    @property
    def done(self) -> bool:
        return all(row.done for row in self.rows)


@dataclass
class Running:
    """The batch decoding now and the requests in it (each leaves when its rows are done)."""

    key: tuple
    batch: object
    generations: list[Generation] = field(default_factory=list)

    @property
    def rows(self) -> int:
        """Slots taken: the rows still decoding."""
        return sum(not row.done for g in self.generations for row in g.rows)


class Scheduler:
    def __init__(self, engine, max_waiting: int = MAX_WAITING, max_batch_rows: int = MAX_BATCH_ROWS,
                 keep_idle_s: float = IDLE_KEEP_S):
        self.engine, self.max_waiting, self.max_batch_rows = engine, max_waiting, max_batch_rows
        self.keep_idle_s = keep_idle_s
        self._waiting: deque[Generation] = deque()
        self._cond = threading.Condition()
        self._stopped = False
        self.batches = self.joins = self.reuses = self.steps = 0
        self._idle: OrderedDict[tuple, tuple[Running, float]] = OrderedDict()   # key -> (batch, when it went idle)
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
        running: Running | None = None
        while True:
            with self._cond:
                while not self._waiting and running is None and not self._stopped:
                    self._cond.wait(self._idle_wait())
                    self._expire_idle()
                if self._stopped:
                    self._idle.clear()
                    return
                if running is None:
                    joining = self._take_batch()
                    running = self._reuse(joining)
                else:
                    joining = self._take_joiners(running)
            try:
                running = self._advance(running, joining)
            except Exception as exc:   # noqa: BLE001 - a failed batch answers its requests, the server lives on
                traceback.print_exc(file=sys.stderr)
                for g in {id(g): g for g in (running.generations if running else []) + joining}.values():
                    g.sink([("error", f"generation failed: {type(exc).__name__}: {exc}")])
                running = None

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

    def _take_joiners(self, running: Running) -> list[Generation]:
        """The waiting requests, oldest first, that join the running batch now: up to the first that
        cannot (another model or sampling, no free slots, a cache that could not hold it)."""
        joining, rows = [], running.rows
        while self._waiting:
            other = self._waiting[0]
            if (other.batch_key != running.key or rows + len(other.rows) > self.max_batch_rows
                    or not self.engine.can_join(running.batch, [r for g in joining for r in g.rows] + other.rows)):
                break
            joining.append(self._waiting.popleft())
            rows += len(other.rows)
        return joining

    # ---- finished batches kept for the next request (module doc) ------------------------
    def _reuse(self, joining: list[Generation]) -> Running | None:
        """The idle batch of `joining`'s key when their rows fit its cache (it is taken out of idle
        either way: one that does not fit is dropped, and a new batch opens)."""
        kept = self._idle.pop(joining[0].batch_key, None)
        rows = [row for g in joining for row in g.rows]
        if kept is None or not self.engine.can_join(kept[0].batch, rows):
            return None
        self.reuses += 1
        return kept[0]

    def _keep_idle(self, running: Running) -> None:
        alone = running.key[-1] is not None   # a seeded request's key is its own: never asked again
        if not getattr(running.batch, "reusable", False) or alone or self.keep_idle_s <= 0:
            return
        self._idle[running.key] = (running, time.monotonic())
        while len(self._idle) > MAX_IDLE:
            self._idle.popitem(last=False)

    def _idle_wait(self) -> float | None:
        """Seconds until the oldest idle batch expires (None: nothing kept, wait for a request)."""
        if not self._idle:
            return None
        oldest = min(when for _, when in self._idle.values())
        return max(0.0, oldest + self.keep_idle_s - time.monotonic())

    def _expire_idle(self) -> None:
        now = time.monotonic()
        for key in [k for k, (_, when) in self._idle.items() if now - when >= self.keep_idle_s]:
            del self._idle[key]

    def _advance(self, running: Running | None, joining: list[Generation]) -> Running | None:
        """Admit `joining` (opening a batch for them when none runs, or into a reused idle one), then one
        decode step; a batch left without requests goes idle (kept when reusable) and None is returned."""
        if joining:
            rows = [row for g in joining for row in g.rows]
            if running is None:
                first = joining[0]
                running = Running(first.batch_key, self.engine.open(rows, first.sampling, first.adapter,
                                                                    first.tokenizer))
                self.batches += 1
            elif running.generations:
                self.joins += len(joining)
            running.generations += joining
            running.batch.admit(rows)
            self._settle(running)
        if running.generations:
            running.batch.step()
            self.steps += 1
            self._settle(running)
        if running.generations:
            return running
        self._keep_idle(running)
        return None

    def _settle(self, running: Running) -> None:
        """Hand out the new text, end the requests whose rows are all done, free their slots."""
        for g in running.generations:
            if g.cancelled.is_set():
                for row in g.rows:
                    row.finish_reason = row.finish_reason or "cancelled"
        self._report(running.generations)
        for g in [g for g in running.generations if g.done]:
            running.generations.remove(g)
            g.sink([("end",)])
        running.batch.retire()

    @staticmethod
    def _report(batch: list[Generation]) -> None:
        for g in batch:
            if g.cancelled.is_set():
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
