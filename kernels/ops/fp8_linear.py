"""A frozen linear layer with FP8 (e4m3fn) weights: Y = X W^T + b, dX = dY W, as scaled FP8 GEMMs.

Storage: W [out, in] as e4m3fn codes with one fp32 scale per output channel (W ~= codes * s_w[:,None]),
half the bytes of bf16. Every product quantizes its other operand per row on the fly
(kernels/ops/fp8_quant.py) and runs as one row-wise scaled GEMM (torch._scaled_mm: the scale of
A's row m and of B's column n multiply the fp32 accumulator in the epilogue):

    forward   X ~= q_x s_x (per token)                 Y[m, o] = s_x[m] s_w[o] sum_i q_x[m,i] q_w[o,i]
    backward  dY diag(s_w) ~= q_d s_d (per token)      dX[m, i] = s_d[m] sum_o q_d[m,o] q_w[o,i]

W's scale runs along backward's contraction dimension, where a row-wise GEMM has no scale, so it
is folded into dY before dY is quantized (one multiply inside the quantize kernel). dW is never
computed: the base weights are frozen (LoRA). The GEMM needs B K-major, so backward reads W
transposed (kernels/ops/fp8_transpose.py). Recipe: torchao's float8 row-wise training
(https://github.com/pytorch/ao/tree/main/torchao/float8) and DeepSeek-V3's fine-grained FP8 GEMMs
(arXiv:2412.19437), here with frozen per-channel weights; the code is ours.

Where the FP8 GEMM cannot run (CPU, or a dimension that is not a multiple of 16, which the GPU
kernels require) the same quantized numbers are multiplied in fp32 (`_emulated_mm`), so results
only differ by accumulation order. `FAST_ACCUM_FORWARD` / `FAST_ACCUM_BACKWARD` choose Hopper's
fast FP8 accumulation per direction (torchao's default: fast in forward, exact in backward).
"""
from __future__ import annotations

from typing import NamedTuple

import torch

from kernels.ops.fp8_quant import FP8_DTYPE, quantize_rows, quantize_rows_reference
from kernels.ops.fp8_transpose import transpose_codes

FAST_ACCUM_FORWARD = True
FAST_ACCUM_BACKWARD = False
# Fused LoRA nodes with FP8 bases keep their input for dA as the FP8 codes + scales they computed
# for the forward GEMM (half the bytes) instead of the bf16 X. On by default since its quality run
# (docs/fp8.md: final eval loss +0.026 % vs bf16, first step 5.5e-4) and the 8B row that needs its
# memory (0.743x Unsloth's); off: dA reads the bf16 X (bench_fp8's `fullx` switch).
SAVE_INPUT_FP8 = True
GEMM_BACKEND = "scaled_mm"   # "emulate": fp32 products of the same codes everywhere (A/B checks)


class Fp8Weight(NamedTuple):
    codes: torch.Tensor   # [out, in] float8_e4m3fn, row-major
    scale: torch.Tensor   # [out] float32: W ~= codes * scale[:, None]


def is_fp8(weight) -> bool:
    return isinstance(weight, Fp8Weight)


def quantize_weight(weight: torch.Tensor) -> Fp8Weight:
    """Per-output-channel e4m3fn codes of a [out, in] weight (the same row kernel as activations)."""
    codes, scale = quantize_rows(weight.detach())
    return Fp8Weight(codes, scale.view(-1))


def dequantize_weight(weight: Fp8Weight, dtype: torch.dtype) -> torch.Tensor:
    return (weight.codes.float() * weight.scale.float()[:, None]).to(dtype)


def fp8_gemm_supported(device: torch.device) -> tuple[bool, str]:
    """(True, "") where torch._scaled_mm runs row-wise FP8 on `device`, else (False, the reason)."""
    if device.type != "cuda":
        return False, f"FP8 matrix products need a CUDA GPU; the model is on {device.type}"
    if not hasattr(torch, "_scaled_mm"):
        return False, f"torch {torch.__version__} has no torch._scaled_mm"
    major, minor = torch.cuda.get_device_capability(device)
    if (major, minor) < (8, 9):
        name = torch.cuda.get_device_name(device)
        return False, (f"FP8 matrix products need compute capability 8.9 or newer (Ada, Hopper); "
                       f"{name} is {major}.{minor}")
    return True, ""


def _gemm_shape_ok(k: int, n: int) -> bool:
    return k % 16 == 0 and n % 16 == 0


_CPU_SCALED_MM: list[bool] = []


def _cpu_scaled_mm_runs() -> bool:
    """torch >= 2.9 also runs torch._scaled_mm on CPU: then CPU tests take the very call the GPU
    takes (argument layout, scales, bias rules); older versions emulate."""
    if not _CPU_SCALED_MM:
        probe = torch.zeros(16, 16, dtype=FP8_DTYPE)
        one = torch.ones(16, 1)
        try:
            torch._scaled_mm(probe, probe.t(), scale_a=one, scale_b=one.t(), out_dtype=torch.float32)
            _CPU_SCALED_MM.append(True)
        except (AttributeError, NotImplementedError, RuntimeError):
            _CPU_SCALED_MM.append(False)
    return _CPU_SCALED_MM[0]


def _emulated_mm(a_codes, a_scale, b_codes, b_scale, out_dtype, bias):
    """fp32 product of the dequantized operands (b_codes [K, N] as passed to the GEMM)."""
    y = (a_codes.float() * a_scale) @ (b_codes.float() * b_scale)
    if bias is not None:
        y = y + bias.float()
    return y.to(out_dtype)


def scaled_mm(a_codes, a_scale, b_codes, b_scale, out_dtype, bias=None, fast_accum=False):
    """(a_codes * a_scale[M,1]) @ (b_codes * b_scale[1,N]) (+ bias) in out_dtype.

    a_codes [M, K] row-major, b_codes [K, N] column-major (a transposed view of a row-major [N, K]).
    """
    if a_codes.stride(1) != 1 or b_codes.stride(0) != 1:
        raise ValueError("scaled_mm: a must be row-major and b column-major (the layout the FP8 "
                         "tensor cores read); pass b as w.t() of a row-major w")
    k, n = b_codes.shape
    on_device = a_codes.is_cuda or _cpu_scaled_mm_runs()
    if GEMM_BACKEND != "scaled_mm" or not on_device or not _gemm_shape_ok(k, n):
        return _emulated_mm(a_codes, a_scale, b_codes, b_scale, out_dtype, bias)
    fused_bias = bias is not None and out_dtype == torch.bfloat16
    y = torch._scaled_mm(a_codes, b_codes, scale_a=a_scale, scale_b=b_scale,
                         bias=bias.to(out_dtype) if fused_bias else None, out_dtype=out_dtype,
                         use_fast_accum=fast_accum)
    if bias is not None and not fused_bias:
        y += bias.to(out_dtype)
    return y


def fp8_project(x_quant: tuple[torch.Tensor, torch.Tensor], weight: Fp8Weight, bias,
                out_dtype: torch.dtype) -> torch.Tensor:
    """Y = X W^T (+ b) from X's per-row codes and scales ([M, in], [M, 1])."""
    codes, scale = x_quant
    return scaled_mm(codes, scale, weight.codes.t(), weight.scale.view(1, -1), out_dtype, bias,
                     FAST_ACCUM_FORWARD)


_ONES: dict[tuple, torch.Tensor] = {}


def _ones_row(n: int, device) -> torch.Tensor:
    key = (n, str(device))
    if key not in _ONES:
        _ONES[key] = torch.ones(1, n, dtype=torch.float32, device=device)
    return _ONES[key]


def fp8_grad_input(grads, weights, out_dtype: torch.dtype) -> torch.Tensor:
    """dX = sum_i dY_i W_i as one FP8 GEMM: the dY_i quantized together per row (with each W_i's
    channel scales folded in) against [W_1; ..; W_k] transposed. grads: [M, out_i] each."""
    weights = list(weights)
    col_scale = torch.cat([w.scale for w in weights]) if len(weights) > 1 else weights[0].scale
    codes, scale = quantize_rows(list(grads), col_scale)
    codes_t = transpose_codes([w.codes for w in weights])          # [in, sum out_i]
    n_in = codes_t.shape[0]
    return scaled_mm(codes, scale, codes_t.t(), _ones_row(n_in, codes.device), out_dtype, None,
                     FAST_ACCUM_BACKWARD)


class Fp8LinearFunction(torch.autograd.Function):
    """apply(x, codes, scale, bias): X W^T + b with W frozen; backward returns dX only."""

    @staticmethod
    def forward(ctx, x, codes, scale, bias):
        x2 = x.reshape(-1, x.shape[-1])
        weight = Fp8Weight(codes, scale)
        y = fp8_project(quantize_rows(x2), weight, bias, x.dtype)
        ctx.weight, ctx.x_shape = weight, x.shape
        return y.view(*x.shape[:-1], y.shape[-1])

    @staticmethod
    def backward(ctx, dy):
        if not ctx.needs_input_grad[0]:
            return None, None, None, None
        dy2 = dy.reshape(-1, dy.shape[-1])
        dx = fp8_grad_input([dy2], [ctx.weight], dy.dtype)
        return dx.view(ctx.x_shape), None, None, None


def fp8_linear(x: torch.Tensor, weight: Fp8Weight, bias: torch.Tensor | None = None) -> torch.Tensor:
    """x [..., in] -> [..., out] with frozen FP8 weight (and frozen bias)."""
    return Fp8LinearFunction.apply(x, weight.codes, weight.scale, bias)


class _EmulatedFp8Group(torch.autograd.Function):
    """k projections of one input in plain PyTorch: X quantized once per row (forward), the k output
    gradients quantized together per row with the weights' channel scales folded in (backward),
    fp32 matmuls of the dequantized codes. apply(x, n, codes_1, scale_1, bias_1, ..)."""

    @staticmethod
    def forward(ctx, x, n, *flat):
        weights = [Fp8Weight(flat[3 * i], flat[3 * i + 1]) for i in range(n)]
        x2 = x.reshape(-1, x.shape[-1])
        x_codes, x_scale = quantize_rows_reference(x2)
        xd = x_codes.float() * x_scale
        outputs = []
        for i, w in enumerate(weights):
            y = xd @ (w.codes.float() * w.scale.float()[:, None]).t()
            bias = flat[3 * i + 2]
            y = y if bias is None else y + bias.float()
            outputs.append(y.to(x.dtype).view(*x.shape[:-1], -1))
        ctx.weights, ctx.x_shape = weights, x.shape
        return tuple(outputs)

    @staticmethod
    def backward(ctx, *grads):
        dys = torch.cat([g.reshape(-1, g.shape[-1]).float() for g in grads], dim=1)
        col_scale = torch.cat([w.scale for w in ctx.weights])
        d_codes, d_scale = quantize_rows_reference(dys, col_scale)
        w_codes = torch.cat([w.codes.float() for w in ctx.weights], dim=0)
        dx = (d_codes.float() * d_scale) @ w_codes
        return (dx.to(grads[0].dtype).view(ctx.x_shape), None) + (None,) * (3 * len(ctx.weights))


def fp8_group_reference(x, weights, biases=None) -> tuple:
    """Reference for k FP8 projections of one input with the fused ops' joint backward quantization."""
    biases = biases or [None] * len(weights)
    flat = [t for w, b in zip(weights, biases) for t in (w.codes, w.scale, b)]
    return _EmulatedFp8Group.apply(x, len(weights), *flat)


def fp8_linear_reference(x, weight: Fp8Weight, bias=None):
    """fp8_linear in plain PyTorch (torch's fp8 cast, fp32 matmuls), for tests."""
    (y,) = fp8_group_reference(x, [weight], [bias])
    return y


class Fp8Linear(torch.nn.Module):
    """Drop-in for a frozen nn.Linear whose weight is stored as FP8 codes + per-channel scales.

    `weight` (codes) and `weight_scale` are non-persistent buffers: a runtime form of the base
    weight (saved adapters never contain it). `.to()` / `.float()` / `.half()` move them between
    devices but never cast them (a cast would turn codes into unscaled numbers).
    """

    def __init__(self, weight: Fp8Weight, bias: torch.nn.Parameter | None):
        super().__init__()
        self.out_features, self.in_features = weight.codes.shape
        self.register_buffer("weight", weight.codes, persistent=False)
        self.register_buffer("weight_scale", weight.scale, persistent=False)
        self.register_parameter("bias", bias)

    @classmethod
    def from_linear(cls, linear: torch.nn.Linear) -> "Fp8Linear":
        bias = linear.bias
        if bias is not None:
            bias.requires_grad_(False)
        return cls(quantize_weight(linear.weight), bias)

    @property
    def fp8_weight(self) -> Fp8Weight:
        return Fp8Weight(self.weight, self.weight_scale)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return fp8_linear(x, self.fp8_weight, self.bias)

    def _apply(self, fn, recurse=True):
        device = fn(torch.empty(0, device=self.weight.device)).device
        codes, scale = self._buffers.pop("weight"), self._buffers.pop("weight_scale")
        try:
            super()._apply(fn, recurse)
        finally:
            self._buffers["weight"], self._buffers["weight_scale"] = codes.to(device), scale.to(device)
        return self

    def extra_repr(self) -> str:
        return (f"in_features={self.in_features}, out_features={self.out_features}, "
                f"bias={self.bias is not None}, weight=float8_e4m3fn + per-channel fp32 scales")


__all__ = ["FP8_DTYPE", "Fp8Linear", "Fp8Weight", "fp8_grad_input", "fp8_linear", "fp8_group_reference", "fp8_linear_reference",
           "fp8_project", "quantize_weight", "scaled_mm"]
