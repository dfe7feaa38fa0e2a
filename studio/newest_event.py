"""Redraws from the whole form that must not land out of order.

Each field's change event carries the form as it was when the event fired, and the browser sends
every event as its own request: two fired close together (a model typed, then a name) can reach
the server in either order. A queue with one worker runs them in the order they arrived, so the
older form could be drawn last (the command box then showed `name: ''` under a typed name).

So the browser stamps each event when it fires (`STAMP_JS`, run before the request is sent) and the
server skips an event older than the newest it has drawn for this page (`newest_only`). The events
must share one queue (a concurrency id with limit 1) for the comparison to be race-free.
"""
from __future__ import annotations

from typing import Any, Callable

import gradio as gr

# the stamp replaces the first input's value; every other input goes on as the browser holds it.
# performance.now(): the page's own clock, which only moves forward (a wall clock set back would
# make every later event look older), and the stamps are compared within one page's session
STAMP_JS = "(...values) => [performance.now(), ...values.slice(1)]"


def newest_only(fn: Callable[..., Any], outputs: int) -> Callable[..., tuple[Any, ...]]:
    """`fn(*values)` for `(stamp, newest, *values)`, its result followed by the new newest stamp;
    an event stamped before the newest drawn changes nothing (`outputs` + 1 skips)."""
    def drawn(stamp: float | None, newest: float | None, *values: Any) -> tuple[Any, ...]:
        if stamp is not None and newest is not None and stamp < newest:
            return (gr.skip(),) * (outputs + 1)
        result = fn(*values)
        return (*(result if isinstance(result, tuple) else (result,)), stamp if stamp is not None else newest)
    return drawn


def stamped(fn: Callable[..., Any], inputs: list[Any], outputs: list[Any]) -> dict[str, Any]:
    """The listener arguments (fn, inputs, outputs, js) of `fn(*inputs) -> outputs` drawn newest-only;
    the hidden stamp and the page's newest stamp are made here, in the current layout."""
    stamp, newest = gr.Number(visible=False), gr.State(None)
    return {"fn": newest_only(fn, len(outputs)), "inputs": [stamp, newest, *inputs],
            "outputs": [*outputs, newest], "js": STAMP_JS}
