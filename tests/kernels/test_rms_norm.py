import pytest
import torch

from kernels.ops.rms_norm import rms_norm, rms_norm_reference
from tests.kernels._tolerances import assert_close

SHAPES = [(3, 37, 341), (5, 64), (1, 2, 3, 129)]


def _inputs(shape, dtype, offset, weight_trains):
    torch.manual_seed(sum(shape))
    x = torch.randn(shape, dtype=torch.float32).mul(2.0).to(dtype).requires_grad_()
    weight = torch.randn(shape[-1]) * 0.2 + (0.0 if offset else 1.0)
    return x, weight.to(dtype).requires_grad_(weight_trains)


def _grads(fn, x, weight, grad_out):
    x.grad = None
    weight.grad = None
    y = fn(x, weight, 1e-6)
    y.backward(grad_out)
    return y.detach(), x.grad.clone(), None if weight.grad is None else weight.grad.clone()


@pytest.mark.parametrize("shape", SHAPES)
@pytest.mark.parametrize("dtype", [torch.float32, torch.float16])
@pytest.mark.parametrize("offset", [0.0, 1.0])
@pytest.mark.parametrize("weight_trains", [False, True])
def test_rms_norm_matches_reference(shape, dtype, offset, weight_trains):
    x, weight = _inputs(shape, dtype, offset, weight_trains)
    grad_out = torch.randn(shape).to(dtype)
    y, dx, dw = _grads(lambda a, w, e: rms_norm(a, w, e, offset), x, weight, grad_out)
    y_ref, dx_ref, dw_ref = _grads(lambda a, w, e: rms_norm_reference(a, w, e, offset), x, weight, grad_out)
    assert y.dtype == y_ref.dtype and y.shape == y_ref.shape
    assert_close(y, y_ref, dtype)
    assert_close(dx, dx_ref, dtype)
    if weight_trains:
        # dW sums over every row: compare relative to its magnitude
        assert_close(dw, dw_ref, dtype, scale=float(dw_ref.abs().max()))
    else:
        assert dw is None


@pytest.mark.parametrize("weight_trains", [False, True])
def test_dw_is_computed_only_when_weight_trains(monkeypatch, weight_trains):
    import kernels.ops.rms_norm as module

    calls = []
    real_backward = module.rms_norm_backward

    def spy(*args):
        calls.append(args[-1])  # compute_dw
        return real_backward(*args)

    monkeypatch.setattr(module, "rms_norm_backward", spy)
    x, weight = _inputs((4, 33), torch.float32, 0.0, weight_trains)
    rms_norm(x, weight, 1e-6).sum().backward()
    assert calls == [weight_trains]
    assert (weight.grad is not None) == weight_trains


def test_gemma_offset_keeps_input_dtype_and_llama_promotes():
    x = torch.randn(2, 16, dtype=torch.float16)
    w32 = torch.ones(16, dtype=torch.float32)
    assert rms_norm(x, w32, 1e-6, 1.0).dtype == torch.float16   # Gemma: type_as(x)
    assert rms_norm(x, w32, 1e-6, 0.0).dtype == torch.float32   # Llama: w * x.to(dtype) promotes


def test_mismatched_weight_is_refused():
    with pytest.raises(ValueError, match="weight must match"):
        rms_norm(torch.randn(2, 8), torch.ones(7))
