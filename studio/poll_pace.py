"""How often the Jobs tab's poll answers and what a page remembers between answers (studio/jobs_tab.py).

A gr.Timer polls every POLL_S seconds while a job runs or waits, or something changed; an idle page
(nothing running or queued, nothing new) polls ever more slowly, up to IDLE_POLL_MAX_S, and any click
brings it back to POLL_S (an open, idle Jobs page cost a third of a core in the browser at 1.5 s;
what Gradio itself cost an idle page and studio is in studio/quiet_page.py).

While a job runs, its charts are re-sent at most every CHART_EVERY_S (the progress, log and buttons
at every poll): each redraw of a chart is vega rebuilding its view in the browser's main thread, and
at every 1.5 s a running job's page spent 60 % of its time in long tasks and answered a click in
3-10 s (1 s with the charts held back; 2-core machine, 2026-12-04; bench/busy_page.py). A pick, a
language or a state change sends them at once. `ShownJob` is the page's record of that."""
from __future__ import annotations

from typing import Any, NamedTuple

import gradio as gr

POLL_S = 1.5
# an idle page's slowest poll: a job started from the CLI or another page shows up within this;
# at 12 s the page's polls still cost chromium ~7 % of a core (bench/idle_page.py, issue 40 item 6)
IDLE_POLL_MAX_S = 30.0
CHART_EVERY_S = 5.0   # a poll re-draws a running job's charts at most this often


class ShownJob(NamedTuple):
    """A page's detail signature while it shows a job: the job's signature when its detail was read
    (id, state, events, log size, language), when its charts were last sent, and whether newer
    charts are owed (held back until CHART_EVERY_S has passed)."""
    signature: tuple
    charts_at: float
    owed: bool


def next_poll(interval: float | None, busy: bool) -> Any:
    """The timer's next interval: POLL_S while something runs, waits or changes; else twice the last."""
    wanted = POLL_S if busy else min(IDLE_POLL_MAX_S, 2 * (interval or POLL_S))
    return gr.skip() if wanted == interval else gr.update(value=wanted)


def shown(detail_sig: Any) -> Any:
    """The page's signature of what it shows, without when its charts were sent."""
    return detail_sig.signature if isinstance(detail_sig, ShownJob) else detail_sig


def charts_owed(detail_sig: Any) -> bool:
    return isinstance(detail_sig, ShownJob) and detail_sig.owed


def charts_due(detail_sig: Any, new_sig: tuple, now: float) -> bool:
    """Whether a poll's answer carries the charts: another job, state or language than the page's,
    or CHART_EVERY_S since its last ones."""
    if not isinstance(detail_sig, ShownJob):
        return True
    old = detail_sig.signature
    return (old[:2], old[-1]) != (new_sig[:2], new_sig[-1]) or now - detail_sig.charts_at >= CHART_EVERY_S


def ended(record: Any, detail_sig: Any) -> bool:
    """The shown job has just finished (its notice, e.g. "Cancelling...", is no longer true)."""
    old = shown(detail_sig)
    was = old[1] if isinstance(old, tuple) and len(old) > 2 and old[0] == record.id else None
    return record.finished and was is not None and was != record.state
