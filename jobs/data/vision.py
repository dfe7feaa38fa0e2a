"""Image-text rows: read the two forms users bring, find their images, and check every image.

Two row forms are accepted (both are `messages` rows):
- content parts, as transformers' chat templates take them:
  {"messages": [{"role": "user", "content": [{"type": "image", "image": "imgs/1.png"},
                                             {"type": "text", "text": "How many red circles?"}]},
                {"role": "assistant", "content": "3"}]}
- LLaMA-Factory's multimodal form: `<image>` placeholders in the text plus an `images` list, taken
  in order (data/mllm_demo.json in LLaMA-Factory's repository):
  {"messages": [{"role": "user", "content": "<image>How many red circles?"}, ...], "images": ["imgs/1.png"]}

Both become messages whose content is a list of parts, with each image part's `image` the
resolved path. Images are files: a relative path is taken relative to the dataset file's folder
and must stay inside it (no `..` or symlink out of it); an absolute path must lie inside one of
the `roots` the caller allows (the studio's --allow-dir folders). URLs are never fetched: a job
reads only what is on disk when it starts. Images appear in user (or system) turns only; the
answer is text."""
from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

from jobs.messages import say

IMAGE_PLACEHOLDER = "<image>"          # LLaMA-Factory's placeholder
URL_PREFIXES = ("http://", "https://", "ftp://", "s3://", "gs://", "data:")
MAX_IMAGE_PIXELS = 64 * 1024 * 1024    # a decompression bomb is refused, not decoded


class RowProblem(ValueError):
    """What is wrong with one row (the caller adds where the row is)."""


@dataclass
class VisionConversation:
    messages: list[dict]       # role + content parts ({"type": "text"|"image", ...}); images resolved
    images: list[Path]         # the row's images, in the order they appear


def is_vision_row(row: dict) -> bool:
    """Whether a row carries images (either form)."""
    if row.get("images"):
        return True
    messages = row.get("messages")
    if not isinstance(messages, list):
        return False
    return any(isinstance(m, dict) and isinstance(m.get("content"), list)
               and any(isinstance(p, dict) and p.get("type") == "image" for p in m["content"])
               for m in messages)


def resolve_image(reference, base_dir: Path, roots: tuple[Path, ...] = ()) -> Path:
    """The real path of an image reference, or RowProblem saying why it cannot be read."""
    if not isinstance(reference, str) or not reference.strip():
        raise RowProblem(say("image_not_path", reference=reference))
    ref = reference.strip()
    if ref.lower().startswith(URL_PREFIXES) or "://" in ref:
        raise RowProblem(say("image_is_url", reference=ref))
    base = Path(os.path.realpath(base_dir))
    real = Path(os.path.realpath(ref if os.path.isabs(ref) else base / ref))
    allowed = (base, *(Path(os.path.realpath(r)) for r in roots))
    if not any(real.is_relative_to(root) for root in allowed):
        raise RowProblem(say("image_outside", reference=ref))
    if not real.is_file():
        raise RowProblem(say("image_missing", reference=ref, path=real))
    return real


def image_problem(path: Path) -> str | None:
    """Why an image file cannot be trained on (None: it opens and decodes)."""
    from PIL import Image, UnidentifiedImageError
    try:
        with Image.open(path) as image:
            if image.width * image.height > MAX_IMAGE_PIXELS:
                return say("image_too_many_pixels", name=path.name, width=image.width, height=image.height,
                           limit=MAX_IMAGE_PIXELS)
            image.load()   # decodes it: a truncated or corrupt file fails here, not at train time
    except UnidentifiedImageError:
        return say("image_not_image", name=path.name)
    except (OSError, ValueError, SyntaxError) as exc:
        return say("image_corrupt", name=path.name, detail=exc)
    return None


def to_vision_conversation(row: dict, base_dir: Path, roots: tuple[Path, ...] = ()) -> VisionConversation:
    """One row (either form) as a VisionConversation; RowProblem names what is wrong."""
    messages = row.get("messages")
    if not isinstance(messages, list) or not messages:
        raise RowProblem(say("vision_no_messages"))
    listed = row.get("images") or []
    if not isinstance(listed, list):
        raise RowProblem(say("vision_images_not_list"))
    pending = list(listed)
    out, images = [], []
    for turn, message in enumerate(messages, 1):
        if not isinstance(message, dict) or message.get("role") not in ("system", "user", "assistant"):
            raise RowProblem(say("vision_bad_role", turn=turn))
        parts = _parts(message.get("content"), pending, turn)
        if message["role"] == "assistant" and any(p["type"] == "image" for p in parts):
            raise RowProblem(say("vision_image_in_answer", turn=turn))
        for part in parts:
            if part["type"] == "image":
                part["image"] = resolve_image(part["image"], base_dir, roots)
                images.append(part["image"])
        out.append({"role": message["role"], "content": parts})
    if pending:
        raise RowProblem(say("vision_image_count", count=len(listed), placeholders=len(listed) - len(pending),
                             placeholder=IMAGE_PLACEHOLDER))
    if not any(m["role"] == "assistant" and _text_of(m) for m in out):
        raise RowProblem(say("vision_no_answer"))
    return VisionConversation(out, images)


def _parts(content, pending: list, turn: int) -> list[dict]:
    """Content as parts; `<image>` placeholders in text take the next path of `pending`."""
    if isinstance(content, str):
        pieces = content.split(IMAGE_PLACEHOLDER)
        parts = []
        for i, piece in enumerate(pieces):
            if i:
                if not pending:
                    raise RowProblem(say("vision_too_many_placeholders", turn=turn,
                                         placeholder=IMAGE_PLACEHOLDER))
                parts.append({"type": "image", "image": pending.pop(0)})
            if piece:
                parts.append({"type": "text", "text": piece})
        return parts
    if not isinstance(content, list):
        raise RowProblem(say("vision_bad_content", turn=turn))
    parts = []
    for part in content:
        kind = part.get("type") if isinstance(part, dict) else None
        if kind == "text" and isinstance(part.get("text"), str):
            parts.append({"type": "text", "text": part["text"]})
        elif kind == "image":
            parts.append({"type": "image", "image": part.get("image", part.get("path", part.get("url")))})
        else:
            raise RowProblem(say("vision_bad_part", turn=turn, part=str(part)[:60]))
    return parts


def _text_of(message: dict) -> str:
    return "".join(p["text"] for p in message["content"] if p["type"] == "text").strip()


def read_vision_rows(rows, base_dir: Path, problems, roots: tuple[Path, ...] = (),
                     open_images: bool = True) -> list[tuple[int, VisionConversation]]:
    """(row index, conversation) for every good row of `rows` (jobs.data.dataset.Rows); each bad
    row goes to `problems` with its place ("row 3 (line 5)"), and so does every bad image."""
    good = []
    for index, row in enumerate(rows):
        where = rows.wheres[index]
        try:
            conversation = to_vision_conversation(row, base_dir, roots)
        except RowProblem as exc:
            problems.add(say("row_problem", where=where, problem=exc), rows.numbers[index])
            continue
        bad = [p for p in map(image_problem, conversation.images) if p] if open_images else []
        if bad:
            problem = say("image_and_more", problem=bad[0], count=len(bad) - 1) if len(bad) > 1 else bad[0]
            problems.add(say("row_problem", where=where, problem=problem), rows.numbers[index])
            continue
        good.append((index, conversation))
    return good
