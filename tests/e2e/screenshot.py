"""Write the README screenshot from a running studio: the Train tab (with the data preview) and the
Jobs tab showing a job's curves, side by side.

    python -m tests.e2e.screenshot --url http://127.0.0.1:7860/ --out docs/screenshot.png [--job ID]

Run it against a studio that has a job with some steps (on a GPU box the GPU curves show too).
The browser test writes the same picture from its tiny-model run when FUSETUNE_SCREENSHOT is set."""
from __future__ import annotations

import argparse
import tempfile
from pathlib import Path

from tests.e2e.browser import chromium_context, combine_screenshots
from tests.e2e.studio_page import pick_option


def capture(url: str, out: Path, job: str | None) -> None:
    with chromium_context() as context, tempfile.TemporaryDirectory() as tmp:
        page = context.new_page()
        page.goto(url)
        page.wait_for_selector("#ft-start", timeout=60_000)
        page.locator("#ft-preview-btn").click()
        page.wait_for_selector("#ft-preview-rows, #ft-preview .ft-notice", timeout=120_000)
        page.evaluate("window.scrollTo(0, 0)")
        page.screenshot(path=f"{tmp}/train.png", full_page=True)

        page.get_by_role("tab", name="Jobs").click()
        pick_option(page, "ft-job-select", job or " · ")  # the newest job unless one is named
        page.wait_for_selector("#ft-progress", timeout=30_000)
        page.wait_for_timeout(3_000)  # plots draw after their data arrives
        page.screenshot(path=f"{tmp}/jobs.png", full_page=True)
        combine_screenshots(Path(tmp) / "train.png", Path(tmp) / "jobs.png", out)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--url", default="http://127.0.0.1:7860/")
    parser.add_argument("--out", type=Path, default=Path("docs/screenshot.png"))
    parser.add_argument("--job", default=None, help="job id to show (default: the newest)")
    args = parser.parse_args()
    capture(args.url, args.out, args.job)
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
