"""builtin:shapes: a small image-text dataset drawn offline with PIL, so that tests and a newcomer
have vision-language data without a download.

Each image holds a few circles and squares in a few colours on a white canvas (seeded, no
overlaps); the question asks how many shapes of one colour and kind it holds ("How many red
circles?") and the answer is the count ("3"). The rows are `messages` rows with image parts
(jobs/data/vision.py), written once as shapes.jsonl beside an imgs/ folder in the data dir."""
from __future__ import annotations

import json
import random
from pathlib import Path

COLOURS = {"red": (220, 40, 40), "blue": (40, 80, 220), "green": (40, 170, 60)}
KINDS = ("circle", "square")
VERSION = 1


def _place(rng: random.Random, size: int, radius: int, taken: list) -> tuple[int, int] | None:
    for _ in range(50):
        x, y = rng.randint(radius, size - radius), rng.randint(radius, size - radius)
        if all((x - a) ** 2 + (y - b) ** 2 > (2 * radius + 2) ** 2 for a, b in taken):
            taken.append((x, y))
            return x, y
    return None


def draw_image(rng: random.Random, size: int) -> tuple[object, dict[tuple[str, str], int]]:
    """(a PIL image, {(colour, kind): count}) with 1 to 5 shapes."""
    from PIL import Image, ImageDraw
    image = Image.new("RGB", (size, size), (255, 255, 255))
    pen = ImageDraw.Draw(image)
    radius, taken, counts = max(4, size // 14), [], {}
    for _ in range(rng.randint(1, 5)):
        colour, kind = rng.choice(list(COLOURS)), rng.choice(KINDS)
        spot = _place(rng, size, radius, taken)
        if spot is None:
            continue
        box = (spot[0] - radius, spot[1] - radius, spot[0] + radius, spot[1] + radius)
        (pen.ellipse if kind == "circle" else pen.rectangle)(box, fill=COLOURS[colour])
        counts[(colour, kind)] = counts.get((colour, kind), 0) + 1
    return image, counts


def shapes_rows(folder: Path, rows: int = 48, size: int = 112, seed: int = 0) -> list[dict]:
    """Draw the images into folder/imgs and return the rows (image paths relative to folder)."""
    rng = random.Random(seed)
    (folder / "imgs").mkdir(parents=True, exist_ok=True)
    out = []
    for i in range(rows):
        image, counts = draw_image(rng, size)
        name = f"imgs/{i:03d}.png"
        image.save(folder / name)
        colour, kind = rng.choice(sorted(counts)) if rng.random() < 0.8 else (rng.choice(list(COLOURS)), rng.choice(KINDS))
        question = f"How many {colour} {kind}s are in the picture? Answer with a number."
        out.append({"messages": [
            {"role": "user", "content": [{"type": "image", "image": name}, {"type": "text", "text": question}]},
            {"role": "assistant", "content": str(counts.get((colour, kind), 0))}]})
    return out


def shapes_dataset(data_dir: Path, rows: int = 48, size: int = 112, seed: int = 0) -> Path:
    """The dataset file (written once per settings): <data dir>/datasets/builtin-shapes-.../shapes.jsonl."""
    folder = Path(data_dir) / "datasets" / f"builtin-shapes-v{VERSION}-{rows}x{size}-s{seed}"
    path = folder / "shapes.jsonl"
    if path.is_file():
        return path
    tmp = folder / "shapes.jsonl.partial"
    lines = [json.dumps(row) for row in shapes_rows(folder, rows, size, seed)]
    tmp.write_text("\n".join(lines) + "\n", encoding="utf-8")
    tmp.replace(path)
    return path
