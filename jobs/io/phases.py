"""(jobs/io) What a job is doing before its first step: "preparing data" (with a count, e.g. the
base model's answers the identity dataset generates), "tokenizing", "loading model".

The trainer installs a reporter (an EventWriter's `phase` event, docs/contracts.md); the code doing
the work calls `report` without knowing who listens, so data and model code keep their signatures.
Without a reporter (tests, the preview) `report` does nothing. Counted phases are written at most
every MIN_INTERVAL_S, plus their last count, so a fast loop does not flood events.jsonl."""
from __future__ import annotations

import time
from typing import Callable

PREPARING, TOKENIZING, LOADING = "preparing data", "tokenizing", "loading model"
PHASES = (PREPARING, TOKENIZING, LOADING)
MIN_INTERVAL_S = 1.0

Reporter = Callable[..., object]
_reporter: Reporter | None = None
_last: tuple[str, float] = ("", 0.0)


def install(reporter: Reporter | None) -> None:
    """reporter(phase=..., done=..., total=..., unit=...), or None to stop reporting."""
    global _reporter, _last
    _reporter, _last = reporter, ("", 0.0)


def report(phase: str, done: int | None = None, total: int | None = None, unit: str = "",
           eta_s: float | None = None) -> None:
    """`eta_s`: the phase's own estimate of its remaining seconds, where it has one (the page shows
    it, so that a long preparation before step 1 does not look stuck)."""
    global _last
    if _reporter is None:
        return
    if phase not in PHASES:
        raise ValueError(f"unknown phase {phase!r}")
    now = time.time()
    final = done is None or total is None or done >= total
    if phase == _last[0] and not final and now - _last[1] < MIN_INTERVAL_S:
        return
    _last = (phase, now)
    fields = {"phase": phase}
    if done is not None and total is not None:
        fields.update(done=int(done), total=int(total), unit=unit)
    if eta_s is not None:
        fields["eta_s"] = round(max(0.0, float(eta_s)), 1)
    _reporter(**fields)
