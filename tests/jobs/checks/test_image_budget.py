"""Images within a budget (issue 36 item 4): a decompression bomb, an image over the pixel limit, a
row and a dataset over their decoded-bytes budgets are refused by row and reference from the
images' headers, by `--dry-run` and by Start; Start opens no image in the studio's own process."""
import os
import resource
import subprocess
import sys

import pytest

from jobs.checks.preflight import run_preflight
from jobs.data import image_budget
from jobs.spec import JobSpec
from studio.start_check import ROOT, StartCheck
from tests.jobs.vision_rows import PARTS_ROW, big_png, bomb_png, image_row, write_dataset


def _check(model, path, tmp_path):
    return run_preflight(JobSpec(model=str(model), dataset=str(path)), data_dir=tmp_path, log=lambda _: None)


def test_a_decompression_bomb_is_refused_by_dry_run_naming_its_row_and_reference(tiny_vision_model, tmp_path):
    """A 30000x30000 PNG of ~110 kB: PIL's own DecompressionBombError becomes the named refusal."""
    path = write_dataset(tmp_path, [PARTS_ROW, image_row("imgs/a.png", "imgs/bomb.png")])
    bomb_png(tmp_path / "imgs" / "bomb.png")
    proc = subprocess.run([sys.executable, "-m", "jobs.train", "--dry-run", "--model", str(tiny_vision_model),
                           "--dataset", str(path), "--output_dir", str(tmp_path / "job")], cwd=ROOT,
                          capture_output=True, text=True, timeout=300, env={**os.environ, "PYTHONPATH": str(ROOT)})
    assert proc.returncode != 0, proc.stdout + proc.stderr
    assert "Traceback" not in proc.stderr
    assert ("row 2 (line 2): image #2 'imgs/bomb.png' has 900,000,000 pixels, more than 67,108,864 (the limit "
            "per image, FUSETUNE_MAX_IMAGE_PIXELS): refused before decoding it") in proc.stderr, proc.stderr


def test_the_pixel_limit_is_the_operators_setting(tiny_vision_model, tmp_path, monkeypatch):
    path = write_dataset(tmp_path, [PARTS_ROW])
    assert _check(tiny_vision_model, path, tmp_path).ok
    monkeypatch.setenv(image_budget.PIXELS_ENV, "4000")
    text = str(_check(tiny_vision_model, path, tmp_path).problems[0])
    assert "row 1 (line 1): image #1 'imgs/a.png' is 56x84: more than 4,000 pixels" in text, text
    monkeypatch.setenv(image_budget.PIXELS_ENV, "many")
    text = str(_check(tiny_vision_model, path, tmp_path).problems[0])
    assert "FUSETUNE_MAX_IMAGE_PIXELS='many' is not a whole number" in text, text


def test_a_dataset_over_its_image_budget_is_refused_at_the_row_that_passes_it(tiny_vision_model, tmp_path,
                                                                            monkeypatch):
    path = write_dataset(tmp_path, [PARTS_ROW] * 3)
    monkeypatch.setenv(image_budget.DATASET_BYTES_ENV, "20000")   # one 56x84 image is 14,112 bytes as RGB
    text = str(_check(tiny_vision_model, path, tmp_path).problems[0])
    assert ("data.jsonl: its images decode to 28,224 bytes by row 2 (line 2), over the budget per dataset of "
            "20,000 bytes (FUSETUNE_MAX_DATASET_IMAGE_BYTES)") in text, text


def test_start_refuses_eight_references_to_one_big_image_in_a_child_process(tiny_vision_model, tmp_path,
                                                                            monkeypatch):
    """Start on a small image-text file: the check runs in studio/preflight_child.py, never here (the
    header and decode functions would fail in this process), and this process's memory stays flat."""
    big_png(tmp_path / "imgs" / "big.png")
    path = write_dataset(tmp_path, [image_row(*["imgs/big.png"] * 8), PARTS_ROW])
    monkeypatch.setenv("FUSETUNE_ALLOW_DIRS", os.pathsep.join([str(tiny_vision_model.parent), str(tmp_path)]))

    def not_here(*_args, **_kwargs):
        raise AssertionError("an image was opened in the studio's process")
    monkeypatch.setattr(image_budget, "header_size", not_here)
    monkeypatch.setattr(image_budget, "decode_problem", not_here)
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    verdict = StartCheck(tmp_path).preflight(JobSpec(model=str(tiny_vision_model), dataset=str(path)))
    grown_mb = (resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - peak) / 1024
    assert [key for key, _ in verdict.problems] == ["dataset"]
    message = verdict.problems[0][1]
    assert ("row 1 (line 1): its 8 images decode to 1,610,612,736 bytes, over the budget per row of 268,435,456 "
            "bytes (FUSETUNE_MAX_ROW_IMAGE_BYTES); the largest is image #1 'imgs/big.png' (8192x8192)") in message
    assert "row 2" not in message
    assert grown_mb < 150, grown_mb   # eight 8192x8192 RGB copies would be 1.5 GB


@pytest.mark.parametrize("name", ["bomb", "truncated"])
def test_bombs_and_broken_files_never_escape_as_exceptions(tmp_path, name):
    path = tmp_path / f"{name}.png"
    if name == "bomb":
        bomb_png(path, side=20000)   # past PIL's warning, under its error: our limit refuses it
    else:
        from PIL import Image
        Image.frombytes("RGB", (64, 64), os.urandom(64 * 64 * 3)).save(path)
        path.write_bytes(path.read_bytes()[:6000])
    budget = image_budget.ImageBudget()
    size, problem = image_budget.header_size(path, "#1 'x.png'", budget)
    problem = problem or image_budget.decode_problem(path, "#1 'x.png'")
    assert size is None or name == "truncated"
    assert problem.startswith("image #1 'x.png' ")
