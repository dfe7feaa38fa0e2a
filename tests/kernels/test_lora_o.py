"""lora_o (one fused LoRA projection) vs plain PyTorch LoRA, forward and backward."""
import pytest
import torch

from kernels.ops.lora_o import lora_o, lora_o_reference
from tests.kernels.lora_cases import REL_TOL, compare_op, projection


def _fused(x, p):
    return lora_o(x, p.weight, p.lora_A, p.lora_B, p.scaling, p.bias)


def _reference(x, p):
    return lora_o_reference(x, p.weight, p.lora_A, p.lora_B, p.scaling, p.bias)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16])
def test_lora_o_matches_reference(dtype):
    torch.manual_seed(0)
    x = torch.randn(3, 37, 341).to(dtype)
    compare_op(_fused, _reference, x, [projection(229, 341, dtype)], REL_TOL[dtype])


def test_lora_o_bias_rank1_and_noncontiguous_input():
    torch.manual_seed(3)
    x = torch.randn(37, 3, 341).transpose(0, 1)   # not contiguous: the op must not care
    compare_op(_fused, _reference, x, [projection(101, 341, torch.float32, rank=1, bias=True)],
               REL_TOL[torch.float32])


def test_lora_o_without_adapter_is_the_frozen_linear():
    torch.manual_seed(4)
    p = projection(64, 96, torch.float32, lora=False)
    x = torch.randn(7, 96, requires_grad=True)
    y = lora_o(x, p.weight)
    y.backward(torch.ones_like(y))
    torch.testing.assert_close(y, x.detach() @ p.weight.t())
    torch.testing.assert_close(x.grad, torch.ones(7, 64) @ p.weight)
