"""dequantize_nf4 is bit-exact with bitsandbytes (0.50) dequantization, weights quantized on CPU.

Two bitsandbytes references: the public `dequantize_4bit` (which on CPU dispatches to a C++ kernel),
and bitsandbytes' own device-independent PyTorch implementation of the same op
(`backends.default.ops._dequantize_4bit_compute`, flat blocks of 64 like the CUDA kernel). On CPU,
bitsandbytes 0.50's C++ kernel disagrees with its own quantizer for some widths (e.g. 96 or 160
columns: errors of 0.1 on weights of scale 0.05), so those shapes are checked against the second
reference only.
"""
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

bnb_functional = pytest.importorskip("bitsandbytes.functional")
from bitsandbytes.backends.default.ops import _dequantize_4bit_compute  # noqa: E402
from bitsandbytes.backends.utils import _get_4bit_code  # noqa: E402

from kernels.ops.nf4 import dequantize_nf4, dequantize_nf4_into_buffer, dequantize_nf4_reference  # noqa: E402


def _quantize(shape, dtype, nested, seed=0, storage=torch.uint8):
    torch.manual_seed(seed)
    weight = (torch.randn(shape) * 0.05).to(dtype)
    weight[0, :3] = torch.tensor([0.0, 1.5, -2.0])   # an exact zero and a block outlier
    return bnb_functional.quantize_4bit(weight, blocksize=64, compress_statistics=nested,
                                        quant_type="nf4", quant_storage=storage)


def _bnb_flat_blocks(packed, state):
    """bitsandbytes' PyTorch dequantize_4bit (the CUDA kernel's flat-block semantics)."""
    absmax = state.absmax
    if state.nested:
        absmax = bnb_functional.dequantize_blockwise(state.absmax, state.state2) + state.offset
    compute = getattr(_dequantize_4bit_compute, "__wrapped__", _dequantize_4bit_compute)  # skip torch.compile
    return compute(packed.view(torch.uint8).reshape(-1), absmax.float(), _get_4bit_code("nf4", packed.device),
                   state.blocksize, state.shape, state.dtype)


# odd shapes: an odd value count (a padded last nibble), sizes not multiples of 64 or 256*64
@pytest.mark.parametrize("shape", [(37, 341), (5, 342), (129, 64), (67, 1001), (32, 96)])
@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16])
@pytest.mark.parametrize("nested", [True, False])
def test_dequantize_nf4_bit_exact(shape, dtype, nested):
    packed, state = _quantize(shape, dtype, nested)
    actual = dequantize_nf4(packed, state)
    expected = _bnb_flat_blocks(packed, state)
    assert actual.dtype == expected.dtype == dtype
    assert torch.equal(actual, expected)
    assert torch.equal(dequantize_nf4_reference(packed, state), expected)
    if shape != (32, 96):   # bitsandbytes' CPU C++ kernel is wrong there (module docstring)
        assert torch.equal(actual, bnb_functional.dequantize_4bit(packed, state, quant_type="nf4"))


def test_dequantize_nf4_into_given_dtype_and_out_buffer():
    packed, state = _quantize((37, 341), torch.bfloat16, True)
    expected = bnb_functional.dequantize_4bit(packed, state, quant_type="nf4")
    out = torch.full((37, 341), float("nan"), dtype=torch.bfloat16)
    assert dequantize_nf4(packed, state, out=out) is out
    assert torch.equal(out, expected)
    fp32 = dequantize_nf4(packed, state, dtype=torch.float32)
    assert fp32.dtype == torch.float32
    # fp32 output skips the bf16 rounding: equal to bitsandbytes within bf16 rounding only
    torch.testing.assert_close(fp32.to(torch.bfloat16), expected, atol=0, rtol=0)


def test_dequantize_nf4_non_uint8_storage():
    packed, state = _quantize((32, 342), torch.bfloat16, True, storage=torch.bfloat16)
    assert packed.dtype == torch.bfloat16
    assert torch.equal(dequantize_nf4(packed, state),
                       bnb_functional.dequantize_4bit(packed, state, quant_type="nf4"))


def test_buffer_is_reused_per_shape():
    bnb = pytest.importorskip("bitsandbytes")
    first, second = (bnb.nn.Params4bit(torch.randn(24, 128).to(torch.bfloat16), requires_grad=False,
                                       quant_type="nf4")._quantize("cpu") for _ in range(2))
    a = dequantize_nf4_into_buffer(first)
    expected_a = a.clone()
    b = dequantize_nf4_into_buffer(second)
    assert a.data_ptr() == b.data_ptr()
    assert torch.equal(b, bnb_functional.dequantize_4bit(second.data, second.quant_state, quant_type="nf4"))
    assert torch.equal(expected_a, bnb_functional.dequantize_4bit(first.data, first.quant_state,
                                                                  quant_type="nf4"))


def test_fp4_is_refused_with_a_reason():
    torch.manual_seed(0)
    packed, state = bnb_functional.quantize_4bit(torch.randn(8, 64), quant_type="fp4")
    with pytest.raises(ValueError, match="nf4"):
        dequantize_nf4(packed, state)


_COMPILE_FOR_HOPPER = """
import triton
from triton.backends.compiler import GPUTarget
from triton.compiler import ASTSource
from kernels.ops.nf4 import _dequantize_nf4_kernel
signature = {"packed_ptr": "*u8", "absmax_ptr": "*u8", "code_ptr": "*fp32", "out_ptr": "*i16",
             "n_values": "i32", "nested_absmax_ptr": "*fp32", "nested_code_ptr": "*fp32",
             "offset_ptr": "*fp32", "BLOCKSIZE": "constexpr", "NESTED_BLOCKSIZE": "constexpr",
             "NESTED": "constexpr", "BF16_BITS": "constexpr", "BLOCK": "constexpr"}
constants = {"BLOCKSIZE": 64, "NESTED_BLOCKSIZE": 256, "NESTED": True, "BF16_BITS": True, "BLOCK": 512}
try:
    source = ASTSource(fn=_dequantize_nf4_kernel, signature=signature, constexprs=constants)
    kernel = triton.compile(source, target=GPUTarget("cuda", 90, 32), options={"enable_fp_fusion": False})
except Exception as exc:
    print("SKIP", type(exc).__name__, exc)
else:
    print("PTX", kernel.asm["ptx"].count("fma.rn.f32"), kernel.asm["ptx"].count("mul.rn.f32"))
"""


def test_kernel_compiles_for_hopper_without_fma():
    """The interpreter cannot see fp contraction: compile the real sm_90 PTX (no GPU needed, in a
    child process without TRITON_INTERPRET) and check the nested-scale `a * b + c` stayed two
    roundings and no product was fused into an FMA (that would break bit-exactness)."""
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    root = Path(__file__).resolve().parents[2]
    result = subprocess.run([sys.executable, "-c", _COMPILE_FOR_HOPPER], env=env, cwd=root,
                            capture_output=True, text=True, timeout=120)
    lines = [line for line in result.stdout.splitlines() if line.startswith(("PTX", "SKIP"))]
    assert lines, result.stderr[-2000:]
    if lines[-1].startswith("SKIP"):   # another Triton's AOT API, or no ptxas on this machine
        pytest.skip(lines[-1])
    _, fma, mul = lines[-1].split()
    assert int(fma) == 0 and int(mul) > 0
