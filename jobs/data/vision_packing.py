"""Packed rows of image-text examples (Qwen2-VL / Qwen2.5-VL): several examples in one row of
max_seq_length, each with its own image tokens, never split.

The text side is jobs/data/packing.py's: the same best-fit-decreasing rows (`BatchPlan`), the same
`collate_packed` for ids, labels (the first label of each example ignored; image tokens and prompts
are already -100, jobs/data/vision_encode.py) and 1-D positions restarting at 0 per example. What
an image-text row adds:
- `pixel_values` and `image_grid_thw` of the row's images, concatenated in row order (the model
  fills the image tokens in that order, one merged patch each);
- M-RoPE positions. Qwen2-VL rotates each head in three sections (temporal, height, width); text
  tokens get the same position in all three, an image's tokens their grid coordinates offset by
  the text before them, and the text after an image resumes at max(h, w) / merge past the offset
  (Qwen2-VL paper, sec. 2.1; transformers' `Qwen2VLModel.get_rope_index`, whose maths
  `mrope_positions` follows for images). Computed per example, restarting at 0, then laid side by
  side; the padding tail counts from 0 like a document of its own.
- `position_ids` in the shape transformers 5.24 takes for packed Qwen2-VL input, [4, rows, L]:
  the 1-D text positions first (what the attention reads the documents from), then the three
  M-RoPE sections (modeling_qwen2_vl.py `Qwen2VLTextModel.forward`: "prepend text-only position
  ids"). No `attention_mask`.

Attention stays inside each example as in text packing (kernels/packed_attention.py): the language
model runs "fusetune_packed", which finds the documents where the text positions restart (one host
sync a forward) and runs the varlen kernel on a GPU, exact per-document attention on CPU. The
batch carries no `cu_seq_lens_q/k`: the model hands its extra kwargs to the vision tower too,
whose own attention takes the image's cu_seqlens under those names (flash: a clash), so the text's
documents are read from the positions instead. The vision tower keeps its own attention (one
image at a time)."""
from __future__ import annotations

import torch

from jobs.data.packing import Batch, BatchPlan, collate_packed, resolve_packing
from jobs.data.vision_encode import VisionExample


def _runs(ids: torch.Tensor, image_token_id: int) -> list[tuple[bool, int, int]]:
    """(is image, start, end) for each maximal run of image / text tokens."""
    is_image = (ids == image_token_id).tolist()
    runs, start = [], 0
    for i in range(1, len(is_image) + 1):
        if i == len(is_image) or is_image[i] != is_image[start]:
            runs.append((is_image[start], start, i))
            start = i
    return runs


def mrope_positions(input_ids: list[int], image_token_id: int, grids: torch.Tensor | None,
                    merge: int) -> torch.Tensor:
    """[3, len(input_ids)] M-RoPE positions of one example starting at 0 (module doc)."""
    ids = torch.tensor(input_ids, dtype=torch.long)
    out = torch.empty(3, len(input_ids), dtype=torch.long)
    grid_list = [] if grids is None else grids.tolist()
    current, image = 0, 0
    for is_image, start, end in _runs(ids, image_token_id):
        if not is_image:
            out[:, start:end] = torch.arange(end - start) + current
            current += end - start
            continue
        t, h, w = grid_list[image]
        h, w, image = h // merge, w // merge, image + 1
        if t * h * w != end - start:
            raise ValueError(f"an image run of {end - start} tokens does not match its grid {t}x{h}x{w}")
        grid = torch.meshgrid(torch.arange(t), torch.arange(h), torch.arange(w), indexing="ij")
        out[:, start:end] = torch.stack(grid).reshape(3, -1) + current
        current += max(h, w)
    return out


def collate_vision_packed(rows: list[list[VisionExample]], row_length: int, pad_id: int,
                          image_token_id: int, merge: int) -> Batch:
    """[rows, row_length] packed image-text rows (module doc)."""
    batch = collate_packed(rows, row_length, pad_id)
    text = batch.tensors["position_ids"]
    rope = text.unsqueeze(0).repeat(3, 1, 1)     # the padding tail: 1-D positions in all three sections
    for r, row in enumerate(rows):
        offset = 0
        for example in row:
            n = len(example.input_ids)
            rope[:, r, offset:offset + n] = mrope_positions(example.input_ids, image_token_id,
                                                            example.image_grid_thw, merge)
            offset += n
    tensors = {"input_ids": batch.tensors["input_ids"], "labels": batch.tensors["labels"],
               "position_ids": torch.cat([text.unsqueeze(0), rope])}
    with_images = [e for row in rows for e in row if e.pixel_values is not None]
    if with_images:
        tensors["pixel_values"] = torch.cat([e.pixel_values for e in with_images])
        tensors["image_grid_thw"] = torch.cat([e.image_grid_thw for e in with_images])
    return Batch(tensors, {}, batch.real_tokens, batch.label_tokens)


class PackedVisionBatchPlan(BatchPlan):
    """BatchPlan's packed rows (best-fit decreasing, seeded, resumable) of image-text examples."""

    def __init__(self, examples: list[VisionExample], batch_size: int, row_length: int, seed: int,
                 pad_id: int, image_token_id: int, merge: int, **kwargs):
        super().__init__(examples, batch_size, row_length, True, seed, pad_id, **kwargs)
        self.image_token_id, self.merge = image_token_id, merge

    def _collate(self, group: list[int]) -> Batch:
        rows = [[self.examples[i] for i in self.rows[r]] for r in group]
        return collate_vision_packed(rows, self.row_length, self.pad_id, self.image_token_id, self.merge)


def packing_note(mode: str, lengths: list[int], capacity: int, seed: int) -> str:
    """Preflight's line: what `packing` will do with these image-text rows (auto: on a GPU and on CPU)."""
    if mode != "auto":
        return "image-text rows: " + resolve_packing(mode, "cpu", lengths, capacity, None, seed)[1]
    on, gpu = resolve_packing(mode, "cuda", lengths, capacity, None, seed)
    if not on:
        return f"image-text rows: {gpu} (on a GPU; on CPU auto is off too)"
    return f"image-text rows: {gpu} on a GPU; off on CPU (set packing: on to pack there)"
