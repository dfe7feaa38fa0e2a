"""Shared browser plumbing for the e2e test and the screenshot script: Debian's chromium through
Playwright (its own browser downloads are not available here), and the docs screenshot."""
from __future__ import annotations

import contextlib
import tempfile
from pathlib import Path

CHROMIUM = Path("/usr/bin/chromium")
CHROME_ARGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
               "--disable-background-networking", "--disable-component-update", "--disable-sync"]
VIEWPORT = {"width": 1400, "height": 1000}


@contextlib.contextmanager
def chromium_context(locale: str = "en-US"):
    """A persistent context on a fresh profile dir, downloads allowed, in the given browser
    language (navigator.language, which the studio's language follows)."""
    from playwright.sync_api import sync_playwright
    with sync_playwright() as pw, tempfile.TemporaryDirectory() as profile:
        context = pw.chromium.launch_persistent_context(
            profile, executable_path=str(CHROMIUM), args=CHROME_ARGS, headless=True,
            accept_downloads=True, viewport=VIEWPORT, locale=locale)
        try:
            yield context
        finally:
            context.close()


@contextlib.contextmanager
def chromium_browser():
    """One headless chromium for a test session; `new_context(browser, locale)` gives isolated
    pages (own cookies and local storage) in a chosen browser language."""
    from playwright.sync_api import sync_playwright
    with sync_playwright() as pw:
        browser = pw.chromium.launch(executable_path=str(CHROMIUM), args=CHROME_ARGS, headless=True)
        try:
            yield browser
        finally:
            browser.close()


def new_context(browser, locale: str = "en-US"):
    context = browser.new_context(accept_downloads=True, viewport=VIEWPORT, locale=locale)
    context.set_default_timeout(90_000)  # a shared 2-core CI box can take that long to answer a click
    return context


def combine_screenshots(first: Path, second: Path, target: Path) -> None:
    """Train and Jobs tab side by side in one image for the README."""
    from PIL import Image
    images = [Image.open(p).convert("RGB") for p in (first, second) if p.exists()]
    if not images:
        return
    width = sum(im.width for im in images) + 16 * (len(images) - 1)
    canvas = Image.new("RGB", (width, max(im.height for im in images)), "white")
    x = 0
    for im in images:
        canvas.paste(im, (x, 0))
        x += im.width + 16
    target.parent.mkdir(parents=True, exist_ok=True)
    canvas.save(target, optimize=True)
