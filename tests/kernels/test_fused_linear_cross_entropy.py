"""fused_linear_cross_entropy vs materialised-logits PyTorch cross-entropy, forward and backward."""
import pytest
import torch

from kernels.ops import fused_linear_cross_entropy as flce_module
from kernels.ops.fused_linear_cross_entropy import (fused_linear_cross_entropy,
                                                    fused_linear_cross_entropy_reference)

N, H, V = 37, 341, 1031
# loss: absolute tolerance; grads: relative to the largest gradient entry
LOSS_TOL = {torch.float32: 1e-5, torch.float16: 2e-4, torch.bfloat16: 2e-3}
GRAD_TOL = {torch.float32: 1e-5, torch.float16: 3e-3, torch.bfloat16: 2e-2}


@pytest.fixture(autouse=True)
def small_chunks(monkeypatch):
    """16 rows per chunk: 37 rows run as 16 + 16 + 5, exercising the chunk loop and ragged tail."""
    monkeypatch.setattr(flce_module, "CHUNK_BYTES", 16 * V * 2)


def _case(dtype, seed=0, train_weight=False, with_bias=False):
    torch.manual_seed(seed)
    hidden = torch.randn(N, H).to(dtype)
    weight = (torch.randn(V, H) * 0.05).to(dtype).requires_grad_(train_weight)
    bias = (torch.randn(V) * 0.1).to(dtype).requires_grad_(train_weight) if with_bias else None
    labels = torch.randint(0, V, (N,))
    labels[::4] = -100
    return hidden, weight, bias, labels


def _run(fn, hidden, weight, bias, labels, upstream=2.0, **kwargs):
    h = hidden.detach().clone().requires_grad_()
    w = weight.detach().clone().requires_grad_(weight.requires_grad)
    b = None if bias is None else bias.detach().clone().requires_grad_(bias.requires_grad)
    loss = fn(h, w, labels, bias=b, **kwargs)
    params = [t for t in (h, w, b) if t is not None and t.requires_grad]
    return loss, torch.autograd.grad(loss * upstream, params)


def _compare(dtype, hidden, weight, bias, labels, **kwargs):
    loss, grads = _run(fused_linear_cross_entropy, hidden, weight, bias, labels, **kwargs)
    # the reference in fp32 from the same (rounded) inputs: what HF's upcast-to-float loss computes
    ref_loss, ref_grads = _run(fused_linear_cross_entropy_reference, hidden.float(), weight.float(),
                               None if bias is None else bias.float(), labels, **kwargs)
    assert loss.dtype == torch.float32
    assert abs(loss.item() - ref_loss.item()) <= LOSS_TOL[dtype] * max(1.0, abs(ref_loss.item()))
    for got, want in zip(grads, ref_grads, strict=True):
        assert got.dtype == dtype
        err = (got.float() - want).abs().max().item()
        assert err <= GRAD_TOL[dtype] * want.abs().max().item(), err


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16])
@pytest.mark.parametrize("skip", [True, False])
def test_flce_mean_over_label_tokens(dtype, skip, monkeypatch):
    """skip: only the 27 labelled rows of 37 run their logits (SKIP_UNLABELED_ROWS); off: all 37."""
    monkeypatch.setattr(flce_module, "SKIP_UNLABELED_ROWS", skip)
    sized = []
    real = flce_module._chunk_rows
    monkeypatch.setattr(flce_module, "_chunk_rows", lambda n, *a: sized.append(n) or real(n, *a))
    _compare(dtype, *_case(dtype))
    assert sized == [27 if skip else N]


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_flce_softcap(dtype):
    hidden, weight, bias, labels = _case(dtype, seed=1)
    _compare(dtype, hidden * 8, weight, bias, labels, softcap=3.0)   # large logits: the cap matters


@pytest.mark.parametrize("num_items", [23, torch.tensor(41)])
def test_flce_num_items_sum_reduction(num_items):
    _compare(torch.float32, *_case(torch.float32, seed=2), num_items=num_items)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16])
def test_flce_trainable_weight_and_bias(dtype):
    _compare(dtype, *_case(dtype, seed=3, train_weight=True, with_bias=True))


def test_flce_frozen_weight_gets_no_gradient_and_no_grad_mode_has_loss_only():
    hidden, weight, _, labels = _case(torch.float32, seed=4)
    h = hidden.clone().requires_grad_()
    fused_linear_cross_entropy(h, weight, labels).backward()
    assert weight.grad is None and h.grad is not None
    with torch.no_grad():
        loss = fused_linear_cross_entropy(hidden, weight, labels)
    torch.testing.assert_close(loss, fused_linear_cross_entropy_reference(hidden, weight, labels))


def test_flce_all_rows_ignored_with_num_items_is_zero():
    hidden, weight, _, labels = _case(torch.float32, seed=5)
    labels[:] = -100
    loss, (grad,) = _run(fused_linear_cross_entropy, hidden, weight, None, labels, num_items=7)
    assert loss.item() == 0.0 and torch.count_nonzero(grad) == 0


def test_flce_label_outside_vocab_gives_nan():
    hidden, weight, _, labels = _case(torch.float32, seed=6)
    labels[1] = V + 5
    assert torch.isnan(fused_linear_cross_entropy(hidden, weight, labels))


def test_flce_rejects_mismatched_shapes():
    hidden, weight, _, labels = _case(torch.float32)
    with pytest.raises(ValueError, match="labels"):
        fused_linear_cross_entropy(hidden, weight, labels[:-1])
    with pytest.raises(ValueError, match="hidden"):
        fused_linear_cross_entropy(hidden[:, :-1], weight, labels)
