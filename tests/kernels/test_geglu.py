import pytest
import torch

from kernels.ops.geglu import geglu, geglu_reference
from tests.kernels.gated_check import check_gated


@pytest.mark.parametrize("approximate", ["tanh", "none"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.float16])
@pytest.mark.parametrize("shape", [(3, 37, 341), (2, 1500)])
@pytest.mark.parametrize("fused_halves", [False, True])
def test_geglu_matches_reference(approximate, dtype, shape, fused_halves):
    check_gated(lambda g, u: geglu(g, u, approximate), lambda g, u: geglu_reference(g, u, approximate),
                 dtype, shape, fused_halves)


@pytest.mark.parametrize("approximate", ["tanh", "none"])
def test_geglu_saturates_without_nan(approximate):
    gate = torch.tensor([[-80.0, -12.0, 0.0, 12.0, 80.0]], requires_grad=True)
    up = torch.ones_like(gate, requires_grad=True)
    out = geglu(gate, up, approximate)
    out.sum().backward()
    expected = geglu_reference(gate.detach(), up.detach(), approximate)
    torch.testing.assert_close(out.detach(), expected)
    assert torch.isfinite(gate.grad).all()
    torch.testing.assert_close(gate.grad, torch.tensor([[0.0, 0.0, 0.5, 1.0, 1.0]]), atol=1e-5, rtol=0)


def test_geglu_refuses_unknown_approximation():
    with pytest.raises(ValueError, match="approximate"):
        geglu(torch.randn(2, 3), torch.randn(2, 3), approximate="sigmoid")
