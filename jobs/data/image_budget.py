"""Budgets for image-text data, checked from each image's header before any pixel is decoded.

A PNG or JPEG header states the image's size in a few bytes while its pixels may decode to
gigabytes (a 30000x30000 1-bit PNG is a few kilobytes on disk and 2.7 GB as RGB: a decompression
bomb). So every image is opened header-only first (PIL's `Image.open` reads no pixels until
`.load()`), and refused by its row and reference when it is over:

- the pixels of one image: $FUSETUNE_MAX_IMAGE_PIXELS, default 64 Mi (an 8192x8192 image fits);
- the decoded bytes of one row's images (each reference counts: eight references to one picture
  are decoded eight times): $FUSETUNE_MAX_ROW_IMAGE_BYTES, default 256 MiB;
- the decoded bytes of a whole dataset: $FUSETUNE_MAX_DATASET_IMAGE_BYTES, default 8 GiB.

Decoded bytes are width x height x 3 (the RGB copy the encoder makes). The limits are the
operator's (the environment of the studio or the CLI), not a job setting: a visitor of the studio
cannot raise them. PIL has its own ceiling (`Image.MAX_IMAGE_PIXELS` x 2, 178,956,970 pixels) past
which it refuses to open a file at all; that refusal is reported the same way. The numbers follow
PIL's own bomb check (Pillow docs, "Image.open": DecompressionBombWarning/Error)."""
from __future__ import annotations

import os
import re
import warnings
from dataclasses import dataclass
from pathlib import Path

from jobs.data.conversation import DataError
from jobs.messages import say

PIXELS_ENV = "FUSETUNE_MAX_IMAGE_PIXELS"
ROW_BYTES_ENV = "FUSETUNE_MAX_ROW_IMAGE_BYTES"
DATASET_BYTES_ENV = "FUSETUNE_MAX_DATASET_IMAGE_BYTES"
DEFAULT_PIXELS = 64 * 1024 * 1024
DEFAULT_ROW_BYTES = 256 * 1024 ** 2
DEFAULT_DATASET_BYTES = 8 * 1024 ** 3
BYTES_PER_PIXEL = 3   # RGB, as jobs/data/vision_encode.py converts every image
_PIL_PIXELS = re.compile(r"\((\d+) pixels\)")


def _env_int(name: str, default: int) -> int:
    raw = os.environ.get(name, "").strip()
    if not raw:
        return default
    try:
        value = int(raw.replace("_", ""))
    except ValueError:
        raise DataError(say("max_row_bytes_not_number", env=name, raw=raw)) from None
    if value < 1:
        raise DataError(say("max_row_bytes_too_small", env=name, raw=raw))
    return value


@dataclass(frozen=True)
class ImageBudget:
    pixels: int = DEFAULT_PIXELS
    row_bytes: int = DEFAULT_ROW_BYTES
    dataset_bytes: int = DEFAULT_DATASET_BYTES

    @classmethod
    def from_env(cls) -> "ImageBudget":
        """The operator's limits; DataError naming the variable when one is not a positive number."""
        return cls(_env_int(PIXELS_ENV, DEFAULT_PIXELS), _env_int(ROW_BYTES_ENV, DEFAULT_ROW_BYTES),
                   _env_int(DATASET_BYTES_ENV, DEFAULT_DATASET_BYTES))


def image_label(index: int, reference) -> str:
    """Which image of a row: its place and the reference as the row wrote it."""
    return f"#{index} {str(reference)!r}"


def header_size(path: Path, label: str, budget: ImageBudget) -> tuple[tuple[int, int] | None, str | None]:
    """((width, height), None) from the header alone, or (None, why it is refused). No pixel is decoded."""
    from PIL import Image, UnidentifiedImageError
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", Image.DecompressionBombWarning)   # our own limit decides below
            with Image.open(path) as image:
                width, height = image.size
    except Image.DecompressionBombError as exc:
        found = _PIL_PIXELS.search(str(exc))
        ceiling = 2 * Image.MAX_IMAGE_PIXELS if Image.MAX_IMAGE_PIXELS else budget.pixels
        return None, say("image_bomb", name=label, pixels=int(found.group(1)) if found else 0,
                         limit=min(budget.pixels, ceiling), env=PIXELS_ENV)
    except UnidentifiedImageError:
        return None, say("image_not_image", name=label)
    except (OSError, ValueError, SyntaxError) as exc:
        return None, say("image_corrupt", name=label, detail=exc)
    if width * height > budget.pixels:
        return None, say("image_too_many_pixels", name=label, width=width, height=height, limit=budget.pixels,
                         env=PIXELS_ENV)
    return (width, height), None


def decode_problem(path: Path, label: str) -> str | None:
    """Why an image (already within the budget) does not decode; None when it does."""
    from PIL import Image, UnidentifiedImageError
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", Image.DecompressionBombWarning)
            with Image.open(path) as image:
                image.load()   # a truncated or corrupt file fails here, not at train time
    except UnidentifiedImageError:
        return say("image_not_image", name=label)
    except (OSError, ValueError, SyntaxError, Image.DecompressionBombError) as exc:
        return say("image_corrupt", name=label, detail=exc)
    return None


def row_bytes_problem(sizes: list[tuple[str, tuple[int, int]]], budget: ImageBudget) -> tuple[int, str | None]:
    """(decoded bytes of a row's images, why the row is over its budget or None)."""
    total = sum(w * h * BYTES_PER_PIXEL for _, (w, h) in sizes)
    if total <= budget.row_bytes:
        return total, None
    label, (width, height) = max(sizes, key=lambda item: item[1][0] * item[1][1])
    return total, say("image_row_over_budget", count=len(sizes), size=total, limit=budget.row_bytes,
                      env=ROW_BYTES_ENV, name=label, width=width, height=height)


def dataset_over_budget(name: str, where: str, total: int, budget: ImageBudget) -> DataError:
    return DataError(say("image_dataset_over_budget", name=name, where=where, size=total,
                         limit=budget.dataset_bytes, env=DATASET_BYTES_ENV))
