"""fp8_transpose: [W_1; ..; W_k] -> [in, sum out_i] byte for byte, Triton (interpreter) and torch paths."""
import pytest
import torch

from kernels.ops import fp8_transpose
from kernels.ops.fp8_quant import FP8_DTYPE
from kernels.ops.fp8_transpose import transpose_codes, transpose_codes_reference


def _codes(rows, cols, seed):
    gen = torch.Generator().manual_seed(seed)
    return torch.randint(0, 255, (rows, cols), generator=gen, dtype=torch.uint8).view(FP8_DTYPE)


@pytest.mark.parametrize("backend", ["triton", "torch"])
def test_transpose_of_odd_shapes_side_by_side(backend, monkeypatch):
    monkeypatch.setattr(fp8_transpose, "BACKEND", backend)
    weights = [_codes(75, 43, 0), _codes(33, 43, 1), _codes(1, 43, 2)]   # tiles cut at every edge
    out = transpose_codes(weights)
    assert out.shape == (43, 109) and out.dtype == FP8_DTYPE
    assert torch.equal(out.view(torch.uint8), transpose_codes_reference(weights).view(torch.uint8))
    assert torch.equal(out[:, 75:108].view(torch.uint8), weights[1].view(torch.uint8).t())


def test_transpose_into_a_given_buffer_and_refusals():
    w = _codes(40, 24, 3)
    out = torch.empty(24, 40, dtype=FP8_DTYPE)
    assert transpose_codes([w], out=out) is out
    assert torch.equal(out.view(torch.uint8), w.view(torch.uint8).t())
    with pytest.raises(ValueError, match="one `in`"):
        transpose_codes([w, _codes(40, 25, 4)])
    with pytest.raises(ValueError, match="contiguous"):
        transpose_codes([w], out=torch.empty(40, 24, dtype=FP8_DTYPE))
