"""widen_codes (kernels/ops/fp8_widen.py) against torch's own e4m3fn cast: every code, odd shapes."""
from __future__ import annotations

import pytest
import torch

from kernels.ops.fp8_widen import widen_codes, widen_codes_reference


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16])
def test_every_code_widens_to_torchs_value(dtype):
    bits = torch.tensor([b for b in range(256) if b not in (0x7F, 0xFF)], dtype=torch.uint8)  # no NaN
    codes = bits.view(torch.float8_e4m3fn)
    got = widen_codes(codes, dtype)
    assert got.dtype == dtype
    assert torch.equal(got, widen_codes_reference(codes, dtype))
    assert torch.equal(got.float().abs().max(), torch.tensor(448.0))


@pytest.mark.parametrize("shape", [(1, 1), (7, 13), (33, 4100), (0, 5)])
def test_odd_shapes_match_the_cast(shape):
    torch.manual_seed(0)
    codes = (torch.randn(shape) * 100).clamp(-448, 448).to(torch.float8_e4m3fn)
    assert torch.equal(widen_codes(codes, torch.bfloat16), codes.to(torch.bfloat16))


def test_other_dtypes_are_refused():
    with pytest.raises(ValueError, match="float8_e4m3fn"):
        widen_codes(torch.zeros(3), torch.bfloat16)
