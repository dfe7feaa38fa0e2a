"""Views that every open page's poll needs, computed once and shared.

Why: with 30 pages open, the Jobs tab's timer asks 20 times a second for the same job table and the
same job's curves and log. Each page keeps its own signature of what it shows (studio/jobs_tab.py
refresh), so most polls answer "unchanged"; what is left is computed once per change (a key that
holds the job's events and log signature) or once per `ttl` (the job table, read from the store),
not once per page. A bounded number of entries is kept; concurrent misses of one key compute it
once (the others wait on its lock), so a burst of polls after a step costs one computation.

A change this studio makes itself (a job started, cancelled, deleted) calls `invalidate()`: what was
read before it is stale at once, whatever its age, and a value is as old as the moment its reading
began, not ended. A poll that was reading while the change happened can tell from `generation` and
must not send what it read (studio/jobs_tab.py): on a loaded machine such a late answer arrived after
Start's own and took the new job out of the list again.

Likewise each page's last pick (a click in the jobs list, Start picking its job) is kept here: a poll
sent before the pick's answer reached the page read the job picked before, and its late answer put
that job's detail under the new pick (seen once under load), so a poll whose job is no longer the
page's pick sends no detail."""
from __future__ import annotations

import threading
import time
from collections import OrderedDict
from typing import Any, Callable, Hashable


class SharedViews:
    def __init__(self, size: int = 64):
        self.size = size
        self._entries: OrderedDict[Hashable, tuple[float, int, Any]] = OrderedDict()
        self._locks: dict[Hashable, threading.Lock] = {}
        self._guard = threading.Lock()
        self.computed = 0   # how many times a value was computed (tests, the benchmark)
        self.generation = 0   # bumped by invalidate(): entries of an older generation are stale
        self._picks: OrderedDict[str, str | None] = OrderedDict()   # page (Gradio session) -> its last pick

    def get(self, key: Hashable, compute: Callable[[], Any], ttl: float | None = None) -> Any:
        """The value under `key`, computed by `compute` when missing (or older than `ttl` seconds)."""
        hit = self._fresh(key, ttl)
        if hit is not None:
            return hit[2]
        with self._guard:
            lock = self._locks.setdefault(key, threading.Lock())
        with lock:
            hit = self._fresh(key, ttl)   # another poll computed it while this one waited
            if hit is not None:
                return hit[2]
            began, generation = time.monotonic(), self.generation
            value = compute()
            with self._guard:
                self.computed += 1
                self._entries[key] = (began, generation, value)
                self._entries.move_to_end(key)
                while len(self._entries) > self.size:
                    old, _ = self._entries.popitem(last=False)
                    self._locks.pop(old, None)
            return value

    def _fresh(self, key: Hashable, ttl: float | None) -> tuple[float, int, Any] | None:
        with self._guard:
            hit = self._entries.get(key)
        if hit is None or hit[1] != self.generation or (ttl is not None and time.monotonic() - hit[0] > ttl):
            return None
        return hit

    def invalidate(self) -> None:
        """Everything read so far is stale (this studio has just changed the job list)."""
        with self._guard:
            self.generation += 1

    def pick(self, page: str, job_id: str | None) -> None:
        """The page (its Gradio session hash) has just picked `job_id`."""
        with self._guard:
            self._picks[page] = job_id
            self._picks.move_to_end(page)
            while len(self._picks) > 16 * self.size:   # a forgotten page's polls are trusted (picked())
                self._picks.popitem(last=False)

    def picked(self, page: str, job_id: str | None) -> bool:
        """Whether `job_id` is still the page's pick (also when the page never picked, or is forgotten)."""
        with self._guard:
            return self._picks.get(page, job_id) == job_id
