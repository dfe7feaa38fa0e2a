"""Packed image-text rows (jobs/data/vision_packing.py) on tiny random Qwen2-VL and Qwen2.5-VL, fp32 on
CPU: M-RoPE positions equal transformers' get_rope_index; a packed row of 3 examples (images of
different sizes, one without an image) gives the loss and LoRA gradients of the same examples run one
a row; and nothing in one example changes another's per-token log-probs."""
import copy

import pytest
import torch
from PIL import Image

from jobs.data.encode import IGNORE_INDEX
from jobs.data.vision import VisionConversation
from jobs.data.vision_encode import collate_vision, encode_vision
from jobs.data.vision_packing import collate_vision_packed, mrope_positions
from kernels.packed_attention import restore_attention, use_packed_attention
from tests.jobs.vision_rows import processor_parts
from tests.kernels.tiny_peft import lora_model
from tests.tiny import make_tiny_vision_model

FAMILIES = ("qwen2_5_vl", "qwen2_vl")
# (width, height, colour) of each example's image; None: a text-only example
IMAGES = [(56, 84, (200, 30, 30)), None, (112, 56, (30, 30, 200))]
QUESTIONS = ["What colour is this?", "Say hello in French.", "Which colour fills the picture?"]
ANSWERS = ["red, a deep red", "bonjour", "blue"]


@pytest.fixture(scope="module", params=FAMILIES)
def folder(request, tmp_path_factory):
    return make_tiny_vision_model(tmp_path_factory.mktemp(request.param) / "model", family=request.param)


def conversation(tmp_path, index: int, image=None, question=None) -> VisionConversation:
    content = question or QUESTIONS[index]
    images = []
    if image is not None:
        width, height, colour = image
        path = tmp_path / f"img{index}-{width}x{height}-{colour[0]}.png"
        Image.new("RGB", (width, height), colour).save(path)
        images, content = [path], [{"type": "image", "image": str(path)}, {"type": "text", "text": content}]
    return VisionConversation([{"role": "user", "content": content},
                               {"role": "assistant", "content": ANSWERS[index]}], images)


def examples(folder, tmp_path, images=IMAGES, questions=(None, None, None)):
    tokenizer, processor, image_id = processor_parts(folder)
    rows = [encode_vision(conversation(tmp_path, i, image, q), tokenizer, processor, image_id, 512)
            for i, (image, q) in enumerate(zip(images, questions))]
    return tokenizer, image_id, rows


def packed(rows, tokenizer, image_id, length=None):
    length = length or sum(len(e.input_ids) for e in rows) + 5   # + a padding tail
    return collate_vision_packed([rows], length, tokenizer.pad_token_id, image_id, merge=2)


def test_mrope_positions_equal_get_rope_index(folder, tmp_path):
    tokenizer, image_id, rows = examples(folder, tmp_path)
    model = lora_model(folder).get_base_model().model
    for example in rows:
        if example.image_grid_thw is None:
            continue
        ids = torch.tensor([example.input_ids])
        expected, _ = model.get_rope_index(ids, (ids == image_id).int(), image_grid_thw=example.image_grid_thw)
        assert torch.equal(mrope_positions(example.input_ids, image_id, example.image_grid_thw, 2), expected[:, 0])


@pytest.mark.parametrize("patched", [False, True], ids=["transformers", "fused-kernels"])
def test_packed_row_has_the_loss_and_grads_of_the_examples_one_a_row(folder, tmp_path, patched):
    tokenizer, image_id, rows = examples(folder, tmp_path)
    grids = [e.image_grid_thw.tolist() for e in rows if e.image_grid_thw is not None]
    assert len(grids) == 2 and grids[0] != grids[1]
    batch = packed(rows, tokenizer, image_id)
    assert batch.tensors["position_ids"].shape == (4, 1, batch.tensors["input_ids"].shape[1])
    count = torch.tensor(batch.label_tokens)
    reference = lora_model(folder)
    model = copy.deepcopy(reference)
    if patched:   # our Triton kernels (fused M-RoPE, RMSNorm, SwiGLU, LoRA, linear cross-entropy)
        from kernels import patch_model
        assert "rope" in {e.op for e in patch_model(model, backend="triton").entries}
    use_packed_attention(model)
    assert model.config.vision_config._attn_implementation != "fusetune_packed"   # the tower keeps its own
    model.zero_grad()
    loss = model(**batch.to(torch.device("cpu")), num_items_in_batch=count).loss
    loss.backward()
    total = 0.0
    for example in rows:   # each alone in its own row, transformers' own positions and attention
        one = collate_vision([example], tokenizer.pad_token_id, image_id)
        one_loss = reference(**one.to(torch.device("cpu")), num_items_in_batch=count).loss
        one_loss.backward()
        total += one_loss.item()
    torch.testing.assert_close(loss.item(), total, rtol=1e-5, atol=0)
    grads = {n: p.grad for n, p in model.named_parameters() if p.grad is not None}
    expected = {n: p.grad for n, p in reference.named_parameters() if p.grad is not None}
    assert grads.keys() == expected.keys() and all("lora_" in n for n in grads)
    for name, grad in grads.items():
        error = (grad - expected[name]).norm() / expected[name].norm()
        assert error < 1e-5, f"{name}: relative error {error:.2e}"
    restore_attention(model)


def token_logps(model, batch) -> torch.Tensor:
    with torch.no_grad():
        logits = model(**{k: v for k, v in batch.to(torch.device("cpu")).items() if k != "labels"}).logits[0]
    ids = batch.tensors["input_ids"][0]
    return torch.log_softmax(logits[:-1], -1).gather(-1, ids[1:, None])[:, 0]


def test_attention_does_not_cross_examples(folder, tmp_path):
    tokenizer, image_id, rows = examples(folder, tmp_path)
    model = lora_model(folder)
    use_packed_attention(model)
    # the first example's image changes colour, the second's question its words: the third is untouched
    other_image = [(56, 84, (10, 220, 10)), None, IMAGES[2]]
    _, _, changed = examples(folder, tmp_path, other_image, (None, "Say goodbye in Italian, please.", None))
    changed = [changed[0], changed[1], rows[2]]
    n2 = len(rows[2].input_ids)

    def third(group):   # log-probs of the third example's tokens 2..n (the first is the previous one's guess)
        start = sum(len(e.input_ids) for e in group[:2])
        return token_logps(model, packed(group, tokenizer, image_id))[start:start + n2 - 1]

    base, after = token_logps(model, packed(rows, tokenizer, image_id)), token_logps(model, packed(changed, tokenizer, image_id))
    n0 = len(rows[0].input_ids)
    assert not torch.allclose(after[:n0 - 1], base[:n0 - 1])   # the first example did see its new image
    torch.testing.assert_close(third(changed), third(rows), rtol=0, atol=1e-5)
    alone = token_logps(model, packed([rows[2]], tokenizer, image_id))[:n2 - 1]
    torch.testing.assert_close(third(rows), alone, rtol=0, atol=1e-5)
    restore_attention(model)


def test_packed_labels_train_answers_only(folder, tmp_path):
    tokenizer, image_id, rows = examples(folder, tmp_path)
    batch = packed(rows, tokenizer, image_id)
    ids, labels = batch.tensors["input_ids"][0], batch.tensors["labels"][0]
    assert (labels[ids == image_id] == IGNORE_INDEX).all()
    answers = tokenizer.decode(labels[labels != IGNORE_INDEX])
    assert all(answer in answers for answer in ANSWERS) and "colour" not in answers
    images = [e for e in rows if e.pixel_values is not None]
    assert torch.equal(batch.tensors["pixel_values"], torch.cat([e.pixel_values for e in images]))
