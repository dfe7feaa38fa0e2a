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
from dataclasses import dataclass, field
from pathlib import Path

from jobs.messages import say

IMAGE_PLACEHOLDER = "<image>"          # LLaMA-Factory's placeholder
URL_PREFIXES = ("http://", "https://", "ftp://", "s3://", "gs://", "data:")


class RowProblem(ValueError):
    """What is wrong with one row (the caller adds where the row is)."""


@dataclass
class VisionConversation:
    messages: list[dict]       # role + content parts ({"type": "text"|"image", ...}); images resolved
    images: list[Path]         # the row's images, in the order they appear
    references: list[str] = field(default_factory=list)   # each image as the row wrote it


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


MAX_SHOWN_REFERENCE = 80   # characters of an image reference a message quotes


def shown_reference(reference):
    """A reference as a message quotes it: a long one (a `data:` URI's base64 runs to megabytes) is
    cut to its start and its length, so the error names the row without echoing the image."""
    text = reference if isinstance(reference, str) else repr(reference)
    if len(text) <= MAX_SHOWN_REFERENCE:
        return reference
    return f"{text[:MAX_SHOWN_REFERENCE]}... ({len(text):,} characters)"


def resolve_image(reference, base_dir: Path, roots: tuple[Path, ...] = ()) -> Path:
    """The real path of an image reference, or RowProblem saying why it cannot be read."""
    if not isinstance(reference, str) or not reference.strip():
        raise RowProblem(say("image_not_path", reference=shown_reference(reference)))
    ref = reference.strip()
    if ref.lower().startswith(URL_PREFIXES) or "://" in ref:
        raise RowProblem(say("image_is_url", reference=shown_reference(ref)))
    base = Path(os.path.realpath(base_dir))
    try:   # a NUL byte (ValueError) or a name past the system's limit (OSError) is no file path
        real = Path(os.path.realpath(ref if os.path.isabs(ref) else base / ref))
        allowed = (base, *(Path(os.path.realpath(r)) for r in roots))
        inside = any(real.is_relative_to(root) for root in allowed)
        exists = inside and real.is_file()
    except (OSError, ValueError):
        raise RowProblem(say("image_not_path", reference=shown_reference(ref))) from None
    if not inside:
        raise RowProblem(say("image_outside", reference=shown_reference(ref)))
    if not exists:
        raise RowProblem(say("image_missing", reference=shown_reference(ref), path=shown_reference(str(real))))
    return real


def to_vision_conversation(row: dict, base_dir: Path, roots: tuple[Path, ...] = ()) -> VisionConversation:
    """One row (either form) as a VisionConversation; RowProblem names what is wrong."""
    messages = row.get("messages")
    if not isinstance(messages, list) or not messages:
        raise RowProblem(say("vision_no_messages"))
    listed = row.get("images") or []
    if not isinstance(listed, list):
        raise RowProblem(say("vision_images_not_list"))
    pending = list(listed)
    out, images, references = [], [], []
    for turn, message in enumerate(messages, 1):
        if not isinstance(message, dict) or message.get("role") not in ("system", "user", "assistant"):
            raise RowProblem(say("vision_bad_role", turn=turn))
        parts = _parts(message.get("content"), pending, turn)
        if message["role"] == "assistant" and any(p["type"] == "image" for p in parts):
            raise RowProblem(say("vision_image_in_answer", turn=turn))
        for part in parts:
            if part["type"] == "image":
                references.append(str(part["image"]))
                part["image"] = resolve_image(part["image"], base_dir, roots)
                images.append(part["image"])
        out.append({"role": message["role"], "content": parts})
    if pending:
        raise RowProblem(say("vision_image_count", count=len(listed), placeholders=len(listed) - len(pending),
                             placeholder=IMAGE_PLACEHOLDER))
    if not any(m["role"] == "assistant" and _text_of(m) for m in out):
        raise RowProblem(say("vision_no_answer"))
    return VisionConversation(out, images, references)


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
    row goes to `problems` with its place ("row 3 (line 5)"), and so does every bad image. With
    open_images, every image is checked against the budgets (jobs/data/image_budget.py) from its
    header first, then decoded one at a time; DataError once the dataset's images pass its budget."""
    from jobs.data.image_budget import ImageBudget, dataset_over_budget
    budget = ImageBudget.from_env() if open_images else None
    good, total = [], 0
    for index, row in enumerate(rows):
        where = rows.wheres[index]
        try:
            conversation = to_vision_conversation(row, base_dir, roots)
        except RowProblem as exc:
            problems.add(say("row_problem", where=where, problem=exc), rows.numbers[index])
            continue
        row_bytes, problem = _row_images(conversation, budget) if open_images else (0, None)
        if problem:
            problems.add(say("row_problem", where=where, problem=problem), rows.numbers[index])
            continue
        total += row_bytes
        if budget is not None and total > budget.dataset_bytes:
            raise dataset_over_budget(rows.name, where, total, budget)
        good.append((index, conversation))
    return good


def _row_images(conversation: VisionConversation, budget) -> tuple[int, str | None]:
    """(decoded bytes of the row's images, the row's problem or None): every header first (sizes,
    the row's budget), and only then is each image decoded, one at a time."""
    from jobs.data.image_budget import decode_problem, header_size, image_label, row_bytes_problem
    labels = [image_label(i, shown_reference(ref))
              for i, ref in enumerate(conversation.references or conversation.images, 1)]
    sizes, bad = [], []
    for path, label in zip(conversation.images, labels):
        size, problem = header_size(path, label, budget)
        if problem:
            bad.append(problem)
        else:
            sizes.append((label, size))
    total, over = row_bytes_problem(sizes, budget) if not bad else (0, None)
    if not bad and not over:
        decoded: dict[Path, str | None] = {}   # one picture referenced eight times is decoded once here
        for path, label in zip(conversation.images, labels):
            if path not in decoded:
                decoded[path] = decode_problem(path, label)
            if decoded[path]:
                bad.append(decoded[path])
    if over:
        return total, over
    if len(bad) > 1:
        return total, say("image_and_more", problem=bad[0], count=len(bad) - 1)
    return total, bad[0] if bad else None
