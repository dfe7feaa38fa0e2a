"""Image-text conversations as training examples: token ids with the image tokens in place, labels
on the answers only, and the image processor's pixel patches.

The text is rendered with the model's own chat template turn by turn (the prefix before each
answer with the generation prompt, then the answer), so each answer's tokens are known exactly
and are the only ones trained: the prompt, the generation header and every image token are -100
(LLaMA-Factory's `mm_plugin` and TRL's VLM collator mask image tokens the same way). Qwen2-VL's
template writes one `<|image_pad|>` per image; like its processor (`Qwen2VLProcessor.__call__`),
each is repeated once per merged patch: grid_t * grid_h * grid_w / merge_size**2.

A row longer than max_seq_length is refused, not cut: cutting would drop image tokens that the
vision tower's features must fill one for one (transformers raises on a mismatch).

Here each example is its own row (a batch pads examples to its longest one); packed rows of several
examples, each with its images and its own M-RoPE positions, are jobs/data/vision_packing.py's."""
from __future__ import annotations

from dataclasses import dataclass

import torch

from jobs.data.encode import IGNORE_INDEX, Example, collate
from jobs.data.packing import Batch, BatchPlan, _label_tokens
from jobs.data.vision import RowProblem, VisionConversation
from jobs.messages import say


@dataclass
class VisionExample(Example):
    pixel_values: torch.Tensor | None = None      # [patches, channels * temporal * patch * patch]
    image_grid_thw: torch.Tensor | None = None    # [images, 3]


def _render(tokenizer, messages: list[dict], generation: bool) -> str:
    if not messages:
        return ""
    return tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=generation)


def template_segments(tokenizer, messages: list[dict]) -> list[tuple[str, bool]]:
    """The rendered conversation as (text, trained) pieces: answers trained, everything else not."""
    segments, cursor = [], ""
    for i, message in enumerate(messages):
        if message["role"] == "assistant":
            prompt = _render(tokenizer, messages[:i], generation=True)
            full = _render(tokenizer, messages[:i + 1], generation=False)
            pieces = [(prompt, False), (full, True)]
        else:
            pieces = [(_render(tokenizer, messages[:i + 1], generation=False), False)]
        for text, trained in pieces:
            if not text.startswith(cursor):
                raise RowProblem(say("vision_template_turns"))
            if len(text) > len(cursor):
                segments.append((text[len(cursor):], trained))
            cursor = text
    return segments


def load_images(conversation: VisionConversation) -> list:
    from PIL import Image
    images = []
    for path in conversation.images:
        with Image.open(path) as image:
            images.append(image.convert("RGB"))
    return images


def encode_vision(conversation: VisionConversation, tokenizer, image_processor, image_token_id: int,
                  max_length: int) -> VisionExample:
    """One conversation as a VisionExample; RowProblem when it does not fit max_length."""
    pixel_values = grid = None
    counts: list[int] = []
    if conversation.images:
        processed = image_processor(images=load_images(conversation), return_tensors="pt")
        pixel_values, grid = processed["pixel_values"], processed["image_grid_thw"]
        merge = getattr(image_processor, "merge_size", 2)
        counts = [int(n) // merge ** 2 for n in grid.prod(-1)]
    ids, labels, seen = [], [], 0
    for text, trained in template_segments(tokenizer, conversation.messages):
        for token in tokenizer(text, add_special_tokens=False)["input_ids"]:
            repeat = 1
            if token == image_token_id:
                if seen >= len(counts):
                    raise RowProblem(say("vision_extra_image_tokens"))
                repeat, seen = counts[seen], seen + 1
            ids.extend([token] * repeat)
            labels.extend([token if trained and token != image_token_id else IGNORE_INDEX] * repeat)
    if seen != len(counts):
        raise RowProblem(say("vision_image_tokens_written", count=seen, images=len(counts)))
    if len(ids) > max_length:
        if counts:
            raise RowProblem(say("vision_row_too_long_images", length=len(ids), shown=sum(counts), limit=max_length))
        raise RowProblem(say("vision_row_too_long", length=len(ids), limit=max_length))
    return VisionExample(ids, labels, pixel_values, grid)


def collate_vision(examples: list[VisionExample], pad_id: int, image_token_id: int) -> Batch:
    """Padded rows plus every example's image patches, concatenated in row order (as the model reads them),
    and `mm_token_type_ids` (1 at image tokens): transformers 5.24 computes M-RoPE's 3-D positions from it
    (Qwen2-VL refuses a batch without it; Qwen2.5-VL would silently fall back to 1-D positions)."""
    tensors = collate(examples, pad_id)
    tensors["mm_token_type_ids"] = (tensors["input_ids"] == image_token_id).int() * tensors["attention_mask"]
    with_images = [e for e in examples if e.pixel_values is not None]
    if with_images:
        tensors["pixel_values"] = torch.cat([e.pixel_values for e in with_images])
        tensors["image_grid_thw"] = torch.cat([e.image_grid_thw for e in with_images])
    real = sum(len(e.input_ids) for e in examples)
    return Batch(tensors, {}, real, sum(_label_tokens(e.labels) for e in examples))


class VisionBatchPlan(BatchPlan):
    """BatchPlan's order (length-grouped, seeded, resumable) over unpacked image-text examples."""

    def __init__(self, examples: list[VisionExample], batch_size: int, row_length: int, seed: int,
                 pad_id: int, image_token_id: int, **kwargs):
        super().__init__(examples, batch_size, row_length, False, seed, pad_id, **kwargs)
        self.image_token_id = image_token_id

    def _collate(self, group: list[int]) -> Batch:
        return collate_vision([self.examples[i] for i in group], self.pad_id, self.image_token_id)


def with_image(messages: list[dict], image_path) -> list[dict]:
    """A chat's messages with an image part put before the text of its last user message."""
    out = [dict(m) for m in messages]
    for message in reversed(out):
        if message["role"] == "user":
            text = message["content"] if isinstance(message["content"], str) else ""
            message["content"] = [{"type": "image", "image": str(image_path)}, {"type": "text", "text": text}]
            break
    return out


def chat_inputs(tokenizer, image_processor, prompts: list[str], image_path) -> dict:
    """Generation inputs for prompts that each hold one image placeholder (with_image + the chat
    template): the placeholder repeated once per merged patch, as Qwen2VLProcessor does, the rows
    padded on the left, and the image's patches once per row."""
    from pathlib import Path
    from PIL import Image
    from jobs.data.image_budget import ImageBudget, header_size
    _, problem = header_size(Path(image_path), Path(image_path).name, ImageBudget.from_env())
    if problem:   # a decompression bomb is refused from its header, never decoded (issue 36)
        raise RowProblem(problem)
    with Image.open(image_path) as image:
        rgb = image.convert("RGB")
    processed = image_processor(images=[rgb] * len(prompts), return_tensors="pt")
    merge = getattr(image_processor, "merge_size", 2)
    token = "<|image_pad|>"
    expanded = [p.replace(token, token * (int(n) // merge ** 2), 1)
                for p, n in zip(prompts, processed["image_grid_thw"].prod(-1))]
    inputs = tokenizer(expanded, return_tensors="pt", add_special_tokens=False, padding=True, padding_side="left")
    types = (inputs["input_ids"] == tokenizer.convert_tokens_to_ids(token)).int() * inputs["attention_mask"]
    return {**inputs, "mm_token_type_ids": types, "pixel_values": processed["pixel_values"],
            "image_grid_thw": processed["image_grid_thw"]}
