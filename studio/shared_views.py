"""Views that every open page's poll needs, computed once and shared.

Why: with 30 pages open, the Jobs tab's timer asks 20 times a second for the same job table and the
same job's curves and log. Each page keeps its own signature of what it shows (studio/jobs_tab.py
refresh), so most polls answer "unchanged"; what is left is computed once per change (a key that
holds the job's events and log signature) or once per `ttl` (the job table, read from the store),
not once per page. A bounded number of entries is kept; concurrent misses of one key compute it
once (the others wait on its lock), so a burst of polls after a step costs one computation."""
from __future__ import annotations

import threading
import time
from collections import OrderedDict
from typing import Any, Callable, Hashable


class SharedViews:
    def __init__(self, size: int = 64):
        self.size = size
        self._entries: OrderedDict[Hashable, tuple[float, Any]] = OrderedDict()
        self._locks: dict[Hashable, threading.Lock] = {}
        self._guard = threading.Lock()
        self.computed = 0   # how many times a value was computed (tests, the benchmark)

    def get(self, key: Hashable, compute: Callable[[], Any], ttl: float | None = None) -> Any:
        """The value under `key`, computed by `compute` when missing (or older than `ttl` seconds)."""
        hit = self._fresh(key, ttl)
        if hit is not None:
            return hit[1]
        with self._guard:
            lock = self._locks.setdefault(key, threading.Lock())
        with lock:
            hit = self._fresh(key, ttl)   # another poll computed it while this one waited
            if hit is not None:
                return hit[1]
            value = compute()
            with self._guard:
                self.computed += 1
                self._entries[key] = (time.monotonic(), value)
                self._entries.move_to_end(key)
                while len(self._entries) > self.size:
                    old, _ = self._entries.popitem(last=False)
                    self._locks.pop(old, None)
            return value

    def _fresh(self, key: Hashable, ttl: float | None) -> tuple[float, Any] | None:
        with self._guard:
            hit = self._entries.get(key)
        if hit is None or (ttl is not None and time.monotonic() - hit[0] > ttl):
            return None
        return hit
