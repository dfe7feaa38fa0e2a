"""fp8_quant (Triton, interpreter) vs torch's own float8_e4m3fn cast: bit-identical codes and scales."""
import pytest
import torch

from kernels.ops.fp8_quant import (FP8_DTYPE, FP8_MAX, dequantize_rows, quantize_rows,
                                   quantize_rows_reference)


def _bits(codes):
    return codes.view(torch.uint8)


def _assert_same(actual, expected):
    (codes, scale), (ref_codes, ref_scale) = actual, expected
    assert codes.dtype == FP8_DTYPE and scale.dtype == torch.float32 and scale.shape == ref_scale.shape
    mismatch = (_bits(codes) != _bits(ref_codes)).nonzero()
    assert len(mismatch) == 0, f"{len(mismatch)} codes differ, first at {mismatch[:3].tolist()}"
    assert torch.equal(scale, ref_scale)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16])
def test_codes_and_scales_match_torch_cast(dtype):
    torch.manual_seed(0)
    # 11 decades of magnitude across the columns: every row has normal and subnormal codes
    x = torch.randn(37, 333) * torch.logspace(-6, 3, 333)
    x[3] = 0.0                                   # an all-zero row (masked tokens)
    x[5, :6] = torch.tensor([1e-30, -3e-7, 5e-5, 7.7e-4, -1.0, 1000.0])
    x = x.to(dtype)
    _assert_same(quantize_rows(x), quantize_rows_reference(x))
    codes, _ = quantize_rows(x)
    assert not _bits(codes[3]).any(), "an all-zero row must give zero codes"


def test_cast_is_round_to_nearest_even_on_every_code_and_tie():
    """With 448 in the row the scale is exactly 1, so the kernel's own fp32 -> e4m3 rounding is
    compared with torch's on every finite code, every midpoint between neighbours, and one fp32
    ulp either side of each midpoint."""
    values = torch.arange(0, 127, dtype=torch.uint8).view(FP8_DTYPE).float()   # all non-negative finite
    mids = (values[1:] + values[:-1]) / 2
    below, above = torch.nextafter(mids, torch.zeros_like(mids)), torch.nextafter(mids, mids * 2)
    row = torch.cat([torch.tensor([FP8_MAX]), values, mids, below, above])
    x = torch.stack([row, -row])
    codes, scale = quantize_rows(x)
    assert torch.equal(scale, torch.ones(2, 1))
    assert torch.equal(_bits(codes), _bits(x.to(FP8_DTYPE)))


def test_segments_and_column_scale_quantize_as_one_row():
    torch.manual_seed(1)
    a, b = torch.randn(21, 48), torch.randn(21, 17).to(torch.bfloat16)
    c = torch.randn(40, 21).t()          # a strided segment (row stride 1, column stride 21)
    col_scale = torch.rand(48 + 17 + 40) + 0.05
    expected = quantize_rows_reference(torch.cat([a, b.float(), c], dim=1), col_scale)
    _assert_same(quantize_rows([a, b, c], col_scale), expected)


def test_round_trip_error_is_within_e4m3_precision():
    torch.manual_seed(2)
    x = torch.randn(64, 200) * torch.rand(64, 1) * 10
    codes, scale = quantize_rows(x)
    err = (dequantize_rows(codes, scale) - x).abs()
    # normal codes: half an ulp of a 3-bit mantissa (2^-4 relative); subnormals: half of 2^-9 scale
    bound = torch.maximum(x.abs() * 2.0 ** -4, scale * 2.0 ** -10)
    assert (err <= bound * 1.0001).all()
    assert err.max() > 0, "quantization must actually round"


def test_bad_arguments_are_refused_with_the_reason():
    with pytest.raises(ValueError, match="same rows"):
        quantize_rows([torch.randn(3, 4), torch.randn(5, 4)])
    with pytest.raises(ValueError, match="col_scale"):
        quantize_rows(torch.randn(3, 4), torch.ones(5))
    with pytest.raises(ValueError, match="1 to 3 segments"):
        quantize_rows([torch.randn(3, 4)] * 4)
