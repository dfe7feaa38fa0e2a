"""fp8_linear (Triton quantize + transposed codes + scaled GEMM) vs its PyTorch emulation, forward
and backward (dX; the weight is frozen), at odd shapes and at GEMM-sized (multiple of 16) shapes."""
import pytest
import torch
import torch.nn.functional as F

from kernels.ops import fp8_linear as fl
from kernels.ops.fp8_linear import (Fp8Linear, Fp8Weight, fp8_group_reference, fp8_grad_input, fp8_linear,
                                    fp8_linear_reference, quantize_weight)
from kernels.ops.fp8_quant import FP8_DTYPE
from tests.kernels.lora_cases import assert_rel_close

# relative to the largest reference value: both sides quantize to the same codes and differ only
# in accumulation order (fp32) or one final rounding (bf16)
TOL = {torch.float32: 1e-5, torch.bfloat16: 1e-2}
SHAPES = [(37, 341, 93), (48, 64, 80)]   # odd (emulated GEMM) and multiple-of-16 (torch._scaled_mm)


def _case(m, k, n, dtype, bias=False, seed=0):
    torch.manual_seed(seed)
    x = (torch.randn(m, k) * torch.rand(m, 1) * 3).to(dtype)
    weight = quantize_weight(torch.randn(n, k) / k ** 0.5 * torch.rand(n, 1))
    b = (torch.randn(n) * 0.1).to(dtype) if bias else None
    return x, weight, b


@pytest.mark.parametrize("shape", SHAPES)
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_fp8_linear_matches_emulation_forward_and_dx(shape, dtype):
    x, weight, bias = _case(*shape, dtype, bias=True)
    x1, x2 = x.clone().requires_grad_(), x.clone().requires_grad_()
    y, y_ref = fp8_linear(x1, weight, bias), fp8_linear_reference(x2, weight, bias)
    assert y.dtype == dtype and y.shape == (shape[0], shape[2])
    assert_rel_close(y, y_ref, TOL[dtype], "Y")
    upstream = torch.randn_like(y_ref)
    y.backward(upstream)
    y_ref.backward(upstream)
    assert x1.grad.dtype == dtype
    assert_rel_close(x1.grad, x2.grad, TOL[dtype], "dX")


def test_fp8_is_within_e4m3_error_of_the_exact_product():
    """Against the unquantized fp32 maths: a few percent (3-bit mantissas), far from 0 and far from
    what a wrong scale would give (a missing channel scale or a transposed weight is ~100%)."""
    torch.manual_seed(3)
    x = torch.randn(64, 256, requires_grad=True)
    w = torch.randn(96, 256) / 16 * torch.rand(96, 1)
    y = fp8_linear(x, quantize_weight(w))
    y_exact = x.detach() @ w.t()
    rel = ((y - y_exact).norm() / y_exact.norm()).item()
    upstream = torch.randn_like(y_exact)
    y.backward(upstream)
    rel_dx = ((x.grad - upstream @ w).norm() / (upstream @ w).norm()).item()
    assert 1e-3 < rel < 0.06 and 1e-3 < rel_dx < 0.06, (rel, rel_dx)


def test_grad_input_of_several_weights_is_one_jointly_quantized_product():
    torch.manual_seed(4)
    weights = [quantize_weight(torch.randn(n, 48) * s) for n, s in ((32, 1.0), (16, 0.01), (16, 3.0))]
    grads = [torch.randn(40, w.codes.shape[0]) for w in weights]
    x = torch.randn(40, 48, requires_grad=True)
    outputs = fp8_group_reference(x, weights)
    torch.autograd.backward(outputs, grads)
    assert_rel_close(fp8_grad_input(grads, weights, torch.float32), x.grad, TOL[torch.float32], "dX")


def test_emulated_and_scaled_mm_backends_agree(monkeypatch):
    x, weight, _ = _case(48, 64, 80, torch.float32, seed=5)
    y = fp8_linear(x, weight)
    monkeypatch.setattr(fl, "GEMM_BACKEND", "emulate")
    assert_rel_close(fp8_linear(x, weight), y, TOL[torch.float32], "Y")


def test_scaled_mm_refuses_a_row_major_b():
    codes = torch.zeros(16, 16, dtype=FP8_DTYPE)
    with pytest.raises(ValueError, match="column-major"):
        fl.scaled_mm(codes, torch.ones(16, 1), codes.t().contiguous().t().contiguous(), torch.ones(1, 16),
                     torch.float32)


def test_fp8_linear_module_keeps_codes_through_casts_and_saves_nothing():
    torch.manual_seed(6)
    linear = torch.nn.Linear(64, 32, bias=True).requires_grad_(False)
    module = Fp8Linear.from_linear(linear)
    assert module.weight.dtype == FP8_DTYPE and module.weight_scale.dtype == torch.float32
    assert list(module.state_dict()) == ["bias"], "the FP8 codes are a runtime form, never saved"
    x = torch.randn(5, 64)
    y, y_exact = module(x), linear(x)
    assert ((y - y_exact).norm() / y_exact.norm()) < 0.06
    module.double().float()      # casts move the bias (exactly here) but never codes or scales
    assert module.weight.dtype == FP8_DTYPE and module.weight_scale.dtype == torch.float32
    assert torch.equal(module(x), y)
    assert module.half().weight.dtype == FP8_DTYPE and module.bias.dtype == torch.float16
    assert "float8_e4m3fn" in repr(module)


def test_dequantized_weight_is_close_to_the_original():
    w = torch.randn(33, 70)
    weight = quantize_weight(w)
    assert isinstance(weight, Fp8Weight) and weight.scale.shape == (33,)
    w_back = fl.dequantize_weight(weight, torch.float32)
    assert ((w_back - w).abs() <= w.abs() * 2 ** -4 + weight.scale[:, None] * 2 ** -10).all()
    assert F.linear(torch.ones(1, 70), w_back).shape == (1, 33)
