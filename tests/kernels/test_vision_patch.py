"""patch_model on a tiny random Qwen2.5-VL with LoRA on its language model: the fused RMSNorm,
RoPE (after M-RoPE's sections are merged), SwiGLU, LoRA and linear cross-entropy give the loss and
LoRA gradients of transformers' own forward (fp32, Triton interpreter on CPU), image batch included."""
import copy

import pytest
import torch

from jobs.data.vision_encode import collate_vision
from kernels import patch_model
from tests.jobs.vision_rows import encoded_shapes
from tests.kernels.tiny_peft import lora_model
from tests.tiny import make_tiny_vision_model


@pytest.fixture(scope="module")
def vl_folder(tmp_path_factory):
    return make_tiny_vision_model(tmp_path_factory.mktemp("vl-patch") / "model")


@pytest.fixture(scope="module")
def qwen2_vl_folder(tmp_path_factory):
    return make_tiny_vision_model(tmp_path_factory.mktemp("vl2-patch") / "model", family="qwen2_vl")


def step(model, batch):
    model.zero_grad(set_to_none=True)
    loss = model(**batch.to(torch.device("cpu"))).loss
    loss.backward()
    return loss.detach(), {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None}


def entry(report, op):
    return next(e for e in report.entries if e.op == op)


@pytest.mark.parametrize("family, vision_lora", [("qwen2_5_vl", False), ("qwen2_5_vl", True), ("qwen2_vl", False)])
def test_patched_vision_model_matches_transformers(request, tmp_path, family, vision_lora):
    folder = request.getfixturevalue("vl_folder" if family == "qwen2_5_vl" else "qwen2_vl_folder")
    tokenizer, examples = encoded_shapes(folder, tmp_path, rows=3)
    batch = collate_vision(examples, tokenizer.pad_token_id, tokenizer.convert_tokens_to_ids("<|image_pad|>"))
    reference = lora_model(folder, vision_lora)
    patched = copy.deepcopy(reference)
    report = patch_model(patched, backend="triton")
    assert report.architecture == f"{family}_text"
    for op in ("rms_norm", "rope", "swiglu", "fused_linear_cross_entropy"):
        assert entry(report, op).backend == "triton", str(report)
    assert entry(report, "rope").modules == 2 and entry(report, "swiglu").modules == 2
    loss, grads = step(patched, batch)
    loss_ref, grads_ref = step(reference, batch)
    torch.testing.assert_close(loss, loss_ref, atol=1e-5, rtol=1e-5)
    assert grads.keys() == grads_ref.keys() and grads
    assert any(".visual." in n for n in grads) == vision_lora
    for name, grad in grads.items():   # relative 1e-5 per LoRA weight (fp32; kernels reorder sums)
        error = (grad - grads_ref[name]).norm() / grads_ref[name].norm()
        assert error < 1e-5, f"{name}: relative error {error:.2e}"
