"""The Train tab's preview of image-text rows: each row's text as the model sees it (chat template
applied, the answer marked trained, each image's run of image tokens shown once with its count)
and a small thumbnail of each of its images (a PNG data URI, at most THUMB pixels a side)."""
from __future__ import annotations

import base64
import io

from jobs.data.dataset import Rows, scan_rows
from jobs.data.vision import read_vision_rows
from jobs.data.vision_dataset import allowed_roots, dataset_file
from jobs.data.vision_encode import encode_vision, template_segments
from jobs.data.conversation import DataError
from jobs.messages import say
from jobs.spec import JobSpec

THUMB = 96


def thumbnail_uri(path) -> str:
    from PIL import Image
    with Image.open(path) as image:
        small = image.convert("RGB")
        small.thumbnail((THUMB, THUMB))
    out = io.BytesIO()
    small.save(out, format="PNG")
    return "data:image/png;base64," + base64.b64encode(out.getvalue()).decode("ascii")


def _shown_segments(tokenizer, messages, counts: list[int], image_token: str) -> list[tuple[str, bool]]:
    """template_segments with each image placeholder written as `<|image_pad|> x N`."""
    pending = list(counts)
    shown = []
    for text, trained in template_segments(tokenizer, messages):
        pieces = text.split(image_token)
        for i in range(1, len(pieces)):
            pieces[i] = f"{image_token} x {pending.pop(0) if pending else '?'}" + pieces[i]
        shown.append(("".join(pieces), trained))
    return shown


def preview_vision_rows(spec: JobSpec, source: str, n: int = 3, data_dir=None) -> list[dict]:
    """The first n rows: `segments` and `tokens` as jobs.data.dataset.preview_rows gives them, plus
    `thumbnails` (data URIs) and `image_tokens`."""
    from jobs.models import load as models
    from jobs.models import vision
    tokenizer = models.load_tokenizer(source)
    processor = vision.load_image_processor(source)
    token, token_id = vision.image_token(tokenizer)
    path = dataset_file(spec.dataset, data_dir)
    rows, problems = scan_rows(str(path), first=n)
    good = read_vision_rows(Rows(rows[:n], rows.numbers[:n], rows.name, rows.wheres[:n]), path.parent,
                            problems, allowed_roots())
    error = problems.error(rows.name)
    if error:
        raise error
    if not good:
        raise DataError(say("no_image_rows", name=rows.name))
    out = []
    for _, conversation in good:
        example = encode_vision(conversation, tokenizer, processor, token_id, 10 ** 9)
        merge = getattr(processor, "merge_size", 2)
        counts = [int(x) // merge ** 2 for x in example.image_grid_thw.prod(-1)] if conversation.images else []
        out.append({"segments": _shown_segments(tokenizer, conversation.messages, counts, token),
                    "tokens": len(example.input_ids), "trained_tokens": example.trained_tokens,
                    "image_tokens": sum(counts), "thumbnails": [thumbnail_uri(p) for p in conversation.images]})
    return out
