"""What a running job's open Jobs page costs the browser: long tasks and a click's answer.

    python bench/busy_page.py [--windows 3] [--out bench/results/busy_page.jsonl]

Starts `app.py` on a fresh data dir (loopback, a free port), opens it in Debian's chromium (headless,
through Playwright, as the browser tests do) and presses Start on the form's defaults (the built-in
model and dataset: a CPU job of a few minutes). Once the job has stepped, for each of `--windows`
10-second windows it sums the page's long tasks (the browser's PerformanceObserver `longtask`
entries: main-thread work over 50 ms, during which a click waits), then times a click: Cancel, until
its question shows, and No. Records the sums and the click times as one JSON line. Bounded: it stops
by itself and kills what it started. (2026-12-04, before the charts were thinned and held back: 6.5 s
of long tasks in 10 s, a click 3.5 -> 10 s as the curves grew.)"""
from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from bench.idle_page import record, studio_in_browser  # noqa: E402

OBSERVE_JS = """() => {
  window.__ftLong = [];
  new PerformanceObserver((list) => { for (const e of list.getEntries()) window.__ftLong.push(e.duration); })
    .observe({type: 'longtask', buffered: false});
}"""


def step_shown(page) -> int:
    """The picked job's step as its progress bar says (data-step; -1 before the bar shows)."""
    bar = page.locator("#ft-progress")
    return int(bar.get_attribute("data-step") or 0) if bar.count() else -1


def click_s(page) -> float:
    """Cancel until its question shows, then No (the job goes on)."""
    began = time.monotonic()
    page.locator("#ft-cancel").click()
    page.wait_for_selector("#ft-confirm-yes", state="visible", timeout=120_000)
    took = time.monotonic() - began
    page.locator("#ft-confirm-no").click()
    page.wait_for_selector("#ft-confirm-yes", state="hidden", timeout=120_000)
    return round(took, 2)


def measure(windows: int) -> dict:
    with studio_in_browser() as (page, _pid):
        page.locator("#ft-start").click()
        deadline = time.monotonic() + 600
        while time.monotonic() < deadline and step_shown(page) < 3:
            page.wait_for_timeout(1000)
        page.evaluate(OBSERVE_JS)
        long_s, clicks, steps = [], [], []
        for _ in range(windows):
            page.evaluate("() => { window.__ftLong = []; }")
            page.wait_for_timeout(10_000)
            long_s.append(round(page.evaluate("() => window.__ftLong.reduce((a, b) => a + b, 0)") / 1000, 2))
            clicks.append(click_s(page))
            steps.append(step_shown(page))
    return {"long_task_s_per_10s": long_s, "click_s": clicks, "steps_seen": steps}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--windows", type=int, default=3)
    parser.add_argument("--note", default="")
    parser.add_argument("--out", default=str(ROOT / "bench" / "results" / "busy_page.jsonl"))
    args = parser.parse_args()
    record("busy_page", {**measure(args.windows), "note": args.note}, args.out)


if __name__ == "__main__":
    main()
