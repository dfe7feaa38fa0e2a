"""Hostile uploads in the browser (issue 23 items 2 and 3): a file over --max-upload-mb is refused
before it is written, in words the page shows, and leaves nothing in the data dir; a row nested
thousands of levels deep is named by number in the upload notice, not a RecursionError."""
from __future__ import annotations

from tests.e2e.studio_page import open_studio, running_app


def _files(folder):
    return sorted(p.name for p in folder.rglob("*") if p.is_file()) if folder.exists() else []


def test_an_upload_over_the_limit_and_a_deeply_nested_row(browser_context, tmp_path, builtin_seed):
    root = tmp_path / "studio"
    root.mkdir()
    with running_app(root, "--max-upload-mb", "1", seed=builtin_seed) as (url, _):
        data = root / "data"
        page = open_studio(browser_context, url)
        big = tmp_path / "big.jsonl"
        big.write_bytes(b'{"text": "' + b"x" * (2 * 1024 ** 2) + b'"}\n')
        with page.expect_file_chooser() as chooser:
            page.locator("#ft-upload").click()
        chooser.value.set_files(str(big))
        page.wait_for_function("() => document.body.innerText.includes('over the upload limit of 1.0 MB')",
                               timeout=60_000)
        assert "--max-upload-mb" in page.locator("body").inner_text()
        assert _files(data / "datasets") == []
        assert [name for name in _files(data / "cache" / "gradio") if "big" in name or name.startswith("tmp")] == []

        deep = tmp_path / "deep.jsonl"
        deep.write_bytes(b'{"text": "fine"}\n' + b"[" * 100_000 + b"]" * 100_000 + b"\n")
        with page.expect_file_chooser() as chooser:
            page.locator("#ft-upload").click()
        chooser.value.set_files(str(deep))
        page.wait_for_function("() => document.querySelector('#ft-upload-info').innerText.includes('nests brackets')",
                               timeout=60_000)
        info = page.locator("#ft-upload-info").inner_text()
        assert "row 2 (line 2)" in info and "nesting limit of 100" in info and "Recursion" not in info
        page.close()
