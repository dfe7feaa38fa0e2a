"""Image-text rows: both row forms, answer-only labels, image tokens in place, and bad rows named by row."""
import pytest

from jobs.data.conversation import DataError
from jobs.data.dataset import scan_rows
from jobs.data.encode import IGNORE_INDEX
from jobs.data.vision import read_vision_rows
from jobs.data.vision_dataset import vision_examples
from jobs.data.vision_encode import collate_vision, encode_vision
from jobs.models import vision
from jobs.spec import JobSpec
from tests.jobs.vision_rows import LLAMA_FACTORY_ROW, PARTS_ROW, processor_parts, write_dataset


def test_both_row_forms_encode_alike_and_only_the_answer_is_trained(tiny_vision_model, tmp_path):
    path = write_dataset(tmp_path, [PARTS_ROW, LLAMA_FACTORY_ROW])
    rows, problems = scan_rows(str(path))
    good = read_vision_rows(rows, path.parent, problems)
    assert problems.count == 0 and len(good) == 2
    tokenizer, processor, image_id = processor_parts(tiny_vision_model)
    first, second = (encode_vision(c, tokenizer, processor, image_id, 256) for _, c in good)
    assert first.input_ids == second.input_ids and first.labels == second.labels
    assert first.image_grid_thw.tolist() == [[1, 6, 4]]            # 84x56 pixels in 14-pixel patches
    image_positions = [i for i, t in enumerate(first.input_ids) if t == image_id]
    assert len(image_positions) == 6 * 4 // 4                       # one token per 2x2 merged patches
    assert all(first.labels[i] == IGNORE_INDEX for i in image_positions)
    trained = tokenizer.decode([t for t, label in zip(first.input_ids, first.labels) if label != IGNORE_INDEX])
    assert trained.startswith("red<|im_end|>") and "What colour" not in trained
    batch = collate_vision([first, second], tokenizer.pad_token_id, image_id).tensors
    assert batch["mm_token_type_ids"].sum() == 2 * len(image_positions)   # M-RoPE's 3-D positions need it
    assert batch["pixel_values"].shape[0] == 2 * 24 and batch["image_grid_thw"].tolist() == [[1, 6, 4]] * 2


def test_bad_rows_are_refused_by_row(tiny_vision_model, tmp_path):
    rows = [PARTS_ROW,
            {**LLAMA_FACTORY_ROW, "images": ["imgs/missing.png"]},
            {**LLAMA_FACTORY_ROW, "images": ["imgs/notes.png"]},
            {**LLAMA_FACTORY_ROW, "images": ["https://example.com/cat.png"]},
            {**LLAMA_FACTORY_ROW, "images": ["../outside.png"]},
            {**LLAMA_FACTORY_ROW, "images": []}]
    path = write_dataset(tmp_path / "set", rows)
    (tmp_path / "set" / "imgs" / "notes.png").write_text("not an image at all")
    write_dataset(tmp_path, [], images=("outside.png",))
    tokenizer, processor, image_id = processor_parts(tiny_vision_model)
    spec = JobSpec(model=str(tiny_vision_model), dataset=str(path))
    with pytest.raises(DataError) as caught:
        vision_examples(spec, "dataset", tokenizer, processor, image_id, tmp_path / "data", log=lambda _: None)
    message = str(caught.value)
    assert "has 5 bad rows" in message
    assert "row 2 (line 2): image 'imgs/missing.png' does not exist" in message
    assert "row 3 (line 3): image #1 'imgs/notes.png' is not an image" in message
    assert "row 4 (line 4): image 'https://example.com/cat.png' is a URL" in message
    assert "row 5 (line 5): image '../outside.png' is outside the dataset's folder" in message
    assert "row 6 (line 6): message 1 has more <image> placeholders than `images`" in message


def test_a_row_past_max_seq_length_is_refused_with_its_image_tokens(tiny_vision_model, tmp_path):
    path = write_dataset(tmp_path, [PARTS_ROW])
    tokenizer, processor, image_id = processor_parts(tiny_vision_model)
    spec = JobSpec(model=str(tiny_vision_model), dataset=str(path), max_seq_length=16)
    with pytest.raises(DataError, match=r"row 1 \(line 1\): is \d+ tokens \(6 of them image tokens\), more than max_seq_length=16"):
        vision_examples(spec, "dataset", tokenizer, processor, image_id, tmp_path / "data", log=lambda _: None)


def test_lora_targets_follow_the_parts():
    names = ["model.visual.blocks.0.attn.qkv", "model.visual.merger.mlp.0",
             "model.language_model.layers.0.self_attn.q_proj", "model.language_model.layers.0.mlp.up_proj", "lm_head"]
    assert vision.lora_targets(names, "all-linear", False) == names[2:4]
    assert vision.lora_targets(names, "all-linear", True) == names[:4]
    assert vision.lora_targets(names, ["q_proj", "vit"], False) == [names[0], names[2]]
    assert vision.lora_targets(names, ["qkv"], False) == []          # a vision layer needs vision_lora
    assert vision.missing_targets(names, ["q_proj", "aligner", "w9"]) == ["w9"]


def test_a_data_uri_image_is_named_by_row_without_echoing_its_base64(tmp_path):
    """Issue 36 item 6: the error for a `data:` URI quoted the whole base64 text (megabytes)."""
    from jobs.data.vision import read_vision_rows
    uri = "data:image/png;base64," + "iVBORw0KGgo" * 20_000
    path = write_dataset(tmp_path, [PARTS_ROW, {**LLAMA_FACTORY_ROW, "images": [uri]},
                                    {**LLAMA_FACTORY_ROW, "images": ["x" * 5000 + ".png"]}])
    rows, problems = scan_rows(str(path))
    read_vision_rows(rows, path.parent, problems, open_images=False)
    message = str(problems.error(rows.name))
    assert "row 2 (line 2): image 'data:image/png;base64,iVBORw0KGgo" in message and "(220,022 characters)' is a URL" in message
    assert "row 3 (line 3): image 'xxxx" in message and "(5,004 characters)' is not a file path" in message
    assert len(message) < 1000
