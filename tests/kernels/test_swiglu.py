import pytest
import torch

from kernels.ops.swiglu import swiglu, swiglu_reference
from tests.kernels.gated_check import check_gated


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16])
@pytest.mark.parametrize("shape", [(3, 37, 341), (2, 1500), (1, 5, 7)])
@pytest.mark.parametrize("fused_halves", [False, True])
def test_swiglu_matches_reference(dtype, shape, fused_halves):
    check_gated(swiglu, swiglu_reference, dtype, shape, fused_halves)


def test_swiglu_backward_writes_into_intermediate_buffers():
    gate_leaf = torch.randn(4, 33, requires_grad=True)
    up_leaf = torch.randn(4, 33, requires_grad=True)
    gate, up = gate_leaf * 1, up_leaf * 1
    gate_before = gate.detach().clone()
    out = swiglu(gate, up)
    out.backward(torch.ones_like(out))
    # d_gate landed in gate's buffer: it now holds the gradient, not the activation input
    torch.testing.assert_close(gate.detach(), gate_leaf.grad)
    assert not torch.equal(gate.detach(), gate_before)


def test_swiglu_leaves_user_leaves_alone():
    gate = torch.randn(3, 17, requires_grad=True)
    up = torch.randn(3, 17, requires_grad=True)
    gate_before, up_before = gate.detach().clone(), up.detach().clone()
    swiglu(gate, up).sum().backward()
    assert torch.equal(gate.detach(), gate_before) and torch.equal(up.detach(), up_before)
    torch.testing.assert_close(up.grad, torch.nn.functional.silu(gate_before))


def test_swiglu_refuses_mismatched_shapes():
    with pytest.raises(ValueError, match="one shape"):
        swiglu(torch.randn(2, 3), torch.randn(2, 4))
