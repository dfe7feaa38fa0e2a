"""kernels/vision_attention.py: a vision tower's attention as one bidirectional varlen call a block.

On CPU the varlen op runs its exact reference (one document at a time), so these tests check the
routing and the maths: the op without the causal mask against sdpa per document (forward and
backward, odd sizes), and a tiny Qwen2.5-VL / Qwen2-VL switched to the function against
transformers' own per-window attention (loss and LoRA gradients of a LoRA'd tower, in fp64: the
two sum in different orders, which fp32 amplifies to ~3e-5 through Qwen2-VL's LayerNorms)."""
import copy

import pytest
import torch

import kernels.vision_attention as vision_attention
from jobs.data.vision_encode import collate_vision
from kernels.ops.varlen_attention import varlen_attention
from kernels.report import PatchReport
from tests.jobs.vision_rows import encoded_shapes
from tests.kernels.tiny_peft import lora_model
from tests.tiny import make_tiny_vision_model


def test_bidirectional_varlen_matches_sdpa_per_document():
    torch.manual_seed(0)
    lengths, heads, dim = [5, 1, 13, 7], 3, 10
    total = sum(lengths)
    q, k, v = (torch.randn(total, heads, dim, requires_grad=True) for _ in range(3))
    cu = torch.tensor([0] + torch.tensor(lengths).cumsum(0).tolist(), dtype=torch.int32)
    out = varlen_attention(q, k, v, cu, max(lengths), causal=False)
    pieces = []
    for start, end in zip(cu[:-1].tolist(), cu[1:].tolist()):
        piece = [t[start:end].transpose(0, 1) for t in (q, k, v)]
        pieces.append(torch.nn.functional.scaled_dot_product_attention(*piece).transpose(0, 1))
    expected = torch.cat(pieces)
    torch.testing.assert_close(out, expected, atol=1e-5, rtol=1e-5)
    grad = torch.randn_like(out)
    got = torch.autograd.grad(out, (q, k, v), grad)
    want = torch.autograd.grad(expected, (q, k, v), grad)
    for g, w in zip(got, want):
        torch.testing.assert_close(g, w, atol=1e-5, rtol=1e-5)


def test_a_sliding_window_is_refused_without_causal_masking():
    q = torch.randn(4, 1, 8)
    with pytest.raises(ValueError, match="causal"):
        varlen_attention(q, q, q, torch.tensor([0, 4], dtype=torch.int32), 4, sliding_window=2, causal=False)


@pytest.fixture(scope="module", params=["qwen2_5_vl", "qwen2_vl"])
def vl_folder(request, tmp_path_factory):
    return make_tiny_vision_model(tmp_path_factory.mktemp(f"vl-attn-{request.param}") / "model",
                                  family=request.param)


def step(model, batch):
    model.zero_grad(set_to_none=True)
    loss = model(**batch).loss
    loss.backward()
    return loss.detach(), {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None}


def test_on_cpu_the_tower_keeps_transformers_attention_and_says_why(vl_folder):
    model = lora_model(vl_folder, True, torch.float64)
    report = PatchReport(backend="torch")
    vision_attention.use_vision_varlen_attention(model, report, use_triton=True)
    entry = next(e for e in report.entries if e.op == "vision_attention")
    assert entry.backend == "torch" and entry.modules == 2 and "not on CUDA" in entry.reason
    assert model.config.vision_config._attn_implementation != vision_attention.NAME


def test_switched_tower_matches_transformers_per_window_attention(vl_folder, tmp_path, monkeypatch):
    tokenizer, examples = encoded_shapes(vl_folder, tmp_path, rows=3)
    batch = collate_vision(examples, tokenizer.pad_token_id, tokenizer.convert_tokens_to_ids("<|image_pad|>"))
    batch = {k: v.double() if v.is_floating_point() else v for k, v in batch.to(torch.device("cpu")).items()}
    reference = lora_model(vl_folder, True, torch.float64)
    switched = copy.deepcopy(reference)
    monkeypatch.setattr(vision_attention, "why_not_fused", lambda modules, use_triton: None)
    calls = []
    monkeypatch.setattr(vision_attention, "varlen_attention",
                        lambda *a, **kw: calls.append(a[3].numel() - 1) or varlen_attention(*a, **kw))
    report = PatchReport(backend="triton")
    vision_attention.use_vision_varlen_attention(switched, report, use_triton=True)
    assert [e.backend for e in report.entries if e.op == "vision_attention"] == ["triton"]
    loss, grads = step(switched, batch)
    # one call a block, each over every piece: more pieces than images where a block is windowed
    assert len(calls) == 2 and min(calls) >= len(examples)
    loss_ref, grads_ref = step(reference, batch)
    torch.testing.assert_close(loss, loss_ref, atol=1e-10, rtol=1e-10)
    assert grads.keys() == grads_ref.keys() and any(".visual." in n for n in grads)
    for name, grad in grads.items():
        error = (grad - grads_ref[name]).norm() / grads_ref[name].norm()
        assert error < 1e-9, f"{name}: relative error {error:.2e}"
    vision_attention.restore_vision_attention(vision_attention._tower_configs(switched)[1])
    assert switched.config.vision_config._attn_implementation == reference.config.vision_config._attn_implementation
