"""An image-text dataset as training examples: read the rows (a file, or builtin:shapes), check
every row and image (jobs/data/vision.py), encode them (jobs/data/vision_encode.py), and collect
every bad row by number, so that a job refuses its data at once instead of failing mid-run.

Image paths that are absolute must lie inside the operator's --allow-dir folders
($FUSETUNE_ALLOW_DIRS, set by app.py); relative ones inside the dataset file's folder."""
from __future__ import annotations

import os
from dataclasses import dataclass, field
from pathlib import Path

from jobs.data.conversation import DataError
from jobs.data.dataset import Problems, Rows, scan_rows
from jobs.data.vision import RowProblem, VisionConversation, read_vision_rows
from jobs.data.vision_encode import VisionExample, encode_vision
from jobs.io import paths
from jobs.messages import say
from jobs.spec import BUILTIN_SHAPES, JobSpec

ALLOW_DIRS_ENV = "FUSETUNE_ALLOW_DIRS"   # the same variable jobs/checks/access.py sets


def allowed_roots() -> tuple[Path, ...]:
    raw = os.environ.get(ALLOW_DIRS_ENV, "")
    return tuple(Path(part) for part in raw.split(os.pathsep) if part.strip())


def dataset_file(reference: str, data_dir=None) -> Path:
    """The JSONL (or other) file behind a vision dataset reference; builtin:shapes is drawn once."""
    if reference == BUILTIN_SHAPES:
        from jobs.data.builtin.shapes import shapes_dataset
        return shapes_dataset(paths.data_dir(data_dir))
    if reference.startswith("builtin:"):
        raise DataError(say("vision_text_builtin", reference=reference, shapes=BUILTIN_SHAPES))
    path = Path(reference).expanduser()
    if not path.is_file():
        raise DataError(say("vision_not_data_file", reference=reference))
    return path


def read_conversations(reference: str, data_dir=None, open_images: bool = True
                       ) -> tuple[Rows, list[tuple[int, VisionConversation]], Problems]:
    """(rows, (row index, conversation) of the good ones, problems of the others)."""
    path = dataset_file(reference, data_dir)
    rows, problems = scan_rows(str(path))
    good = read_vision_rows(rows, path.parent, problems, allowed_roots(), open_images=open_images)
    return rows, good, problems


@dataclass
class EncodedRows:
    examples: list[VisionExample] = field(default_factory=list)
    image_tokens: list[int] = field(default_factory=list)   # per example
    images: int = 0


def encode_rows(rows: Rows, good, tokenizer, image_processor, image_token_id: int, max_length: int,
                problems: Problems) -> EncodedRows:
    """Encode every good conversation; rows that do not fit (or do not render) go to `problems`."""
    out = EncodedRows()
    for index, conversation in good:
        try:
            example = encode_vision(conversation, tokenizer, image_processor, image_token_id, max_length)
        except RowProblem as exc:
            problems.add(say("row_problem", where=rows.wheres[index], problem=exc), rows.numbers[index])
            continue
        out.examples.append(example)
        out.image_tokens.append(sum(1 for t in example.input_ids if t == image_token_id))
        out.images += len(conversation.images)
    return out


def vision_examples(spec: JobSpec, key: str, tokenizer, image_processor, image_token_id: int,
                    data_dir=None, log=print) -> list[VisionExample]:
    """Every example of spec.<key>, or a DataError naming the bad rows (the first 10, and how many)."""
    rows, good, problems = read_conversations(getattr(spec, key), data_dir)
    encoded = encode_rows(rows, good, tokenizer, image_processor, image_token_id, spec.max_seq_length, problems)
    error = problems.error(rows.name)
    if error is not None:
        raise error
    if not encoded.examples:
        raise DataError(say("no_image_rows", name=rows.name))
    log(f"{key}: {len(encoded.examples)} image-text examples, {encoded.images} images, "
        f"{sum(encoded.image_tokens):,} image tokens (never trained; only the answers are)")
    return encoded.examples
