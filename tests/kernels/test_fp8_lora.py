"""The fused LoRA ops with FP8 base weights (lora_o, lora_qkv, lora_mlp) vs a PyTorch reference that
quantizes the same way (kernels.ops.fp8_linear.fp8_group_reference: X once per node, the k output
gradients of a node together), forward and backward: outputs, dX and every adapter gradient. With
fp8_linear.SAVE_INPUT_FP8 (the default) the nodes' dA reads X's e4m3 codes: the reference does too."""
import pytest
import torch
import torch.nn.functional as F

from kernels.ops import fp8_linear
from kernels.ops.fp8_linear import fp8_group_reference, quantize_weight
from kernels.ops.fp8_quant import dequantize_rows, quantize_rows_reference
from kernels.ops.lora_mlp import lora_mlp
from kernels.ops.lora_o import lora_o
from kernels.ops.lora_qkv import lora_qkv
from tests.kernels.lora_cases import REL_TOL, compare_op, projection

HIDDEN, KV_OUT, INTER = 141, 37, 103
TOL = {torch.float32: 2e-4, torch.bfloat16: REL_TOL[torch.bfloat16]}


def fp8_projection(out_f, in_f, dtype, **kwargs):
    p = projection(out_f, in_f, torch.float32, **kwargs)
    bias = None if p.bias is None else p.bias.to(dtype)
    return p._replace(weight=quantize_weight(p.weight * (1 + torch.rand(out_f, 1))), bias=bias)


def input_for_a(x):
    """What a node's dA reads in place of X under SAVE_INPUT_FP8 (X's e4m3 codes times their row
    scales, a constant), or None when it reads X."""
    if not fp8_linear.SAVE_INPUT_FP8:
        return None
    codes, scale = quantize_rows_reference(x.detach())
    return dequantize_rows(codes, scale, x.dtype).reshape(x.shape)


def _lora_term(x, p, x_for_a=None):
    if p.lora_A is None:
        return 0
    a = p.lora_A.to(x.dtype)
    xa = F.linear(x, a if x_for_a is None else a.detach())
    if x_for_a is not None:   # adds exactly 0 to the value; dA = dXA^T x_for_a
        seen = F.linear(x_for_a, a)
        xa = xa + (seen - seen.detach())
    return p.scaling * F.linear(xa, p.lora_B.to(x.dtype))


def o_reference(x, p):
    (y,) = fp8_group_reference(x, [p.weight], [p.bias])
    return y + _lora_term(x, p, input_for_a(x))


def qkv_reference(x, *projections):
    bases = fp8_group_reference(x, [p.weight for p in projections], [p.bias for p in projections])
    xa = input_for_a(x)
    return tuple(y + _lora_term(x, p, xa) for y, p in zip(bases, projections))


def mlp_reference(x, gate, up, down, activation="swiglu"):
    xa = input_for_a(x)
    e, g = (y + _lora_term(x, p, xa) for y, p in zip(fp8_group_reference(x, [gate.weight, up.weight]), (gate, up)))
    h = (F.silu(e) if activation == "swiglu" else F.gelu(e, approximate="tanh")) * g
    (y,) = fp8_group_reference(h, [down.weight], [down.bias])
    return y + _lora_term(h, down)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_lora_o_fp8(dtype):
    torch.manual_seed(0)
    x = torch.randn(3, 37, HIDDEN).to(dtype)
    p = fp8_projection(HIDDEN, HIDDEN, dtype, bias=True)
    compare_op(lambda x_, p_: lora_o(x_, *p_), o_reference, x, [p], TOL[dtype])


@pytest.mark.parametrize("save_input_fp8", [True, False])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_lora_qkv_fp8_one_backward_gemm_for_three_projections(dtype, save_input_fp8, monkeypatch):
    monkeypatch.setattr(fp8_linear, "SAVE_INPUT_FP8", save_input_fp8)
    torch.manual_seed(1)
    x = torch.randn(2, 29, HIDDEN).to(dtype)
    qkv = [fp8_projection(HIDDEN, HIDDEN, dtype, bias=True), fp8_projection(KV_OUT, HIDDEN, dtype, lora=False),
           fp8_projection(KV_OUT, HIDDEN, dtype, rank=16)]
    compare_op(lora_qkv, qkv_reference, x, qkv, TOL[dtype])


@pytest.mark.parametrize("rank", [5, 16])   # 16: gate/up LoRA add inside the activation kernel
@pytest.mark.parametrize("activation", ["swiglu", "geglu"])
def test_lora_mlp_fp8(rank, activation):
    torch.manual_seed(2)
    x = torch.randn(2, 23, HIDDEN)
    mlp = [fp8_projection(INTER, HIDDEN, torch.float32, rank=rank),
           fp8_projection(INTER, HIDDEN, torch.float32, rank=rank),
           fp8_projection(HIDDEN, INTER, torch.float32, rank=rank)]
    # the backward kernel's d(gate), d(up) differ from autograd's by fp32 rounding, which can move a
    # value across an e4m3 rounding boundary: allow a few such codes
    compare_op(lora_mlp, mlp_reference, x, mlp, 5e-3, activation=activation)


def test_lora_mlp_fp8_bf16_activations():
    torch.manual_seed(3)
    x = torch.randn(41, HIDDEN).to(torch.bfloat16)
    mlp = [fp8_projection(INTER, HIDDEN, torch.bfloat16, rank=16) for _ in range(2)]
    mlp.append(fp8_projection(HIDDEN, INTER, torch.bfloat16, rank=16))
    compare_op(lora_mlp, mlp_reference, x, mlp, TOL[torch.bfloat16])


@pytest.mark.parametrize("op", ["qkv", "mlp"])
def test_saving_the_input_as_fp8_codes(op, monkeypatch):
    """SAVE_INPUT_FP8: the node keeps X as e4m3 codes + row scales (no full-precision copy of X is
    saved); outputs, dX and dB are unchanged, dA moves by e4m3 rounding only."""
    torch.manual_seed(4)
    x = torch.randn(19, 64)
    if op == "qkv":
        fn, projections = lora_qkv, [fp8_projection(64, 64, torch.float32, rank=4) for _ in range(3)]
    else:
        fn = lora_mlp
        projections = [fp8_projection(48, 64, torch.float32, rank=4) for _ in range(2)]
        projections.append(fp8_projection(64, 48, torch.float32, rank=4))
    params = [t for p in projections for t in (p.lora_A, p.lora_B)]

    def run():
        xx = x.clone().requires_grad_()
        saved = []
        with torch.autograd.graph.saved_tensors_hooks(lambda t: saved.append(t) or t, lambda t: t):
            outs = fn(xx, *projections)
        outs = outs if isinstance(outs, tuple) else (outs,)
        grads = torch.autograd.grad(outs, [xx] + params, [torch.ones_like(o) for o in outs])
        return outs, grads, saved

    monkeypatch.setattr(fp8_linear, "SAVE_INPUT_FP8", False)
    outs, grads, saved = run()
    monkeypatch.setattr(fp8_linear, "SAVE_INPUT_FP8", True)
    outs_q, grads_q, saved_q = run()
    assert any(t.dtype == torch.float8_e4m3fn and t.shape == (19, 64) for t in saved_q)
    assert not any(t.dtype == torch.float32 and t.shape == (19, 64) for t in saved_q)
    assert any(t.dtype == torch.float32 and t.shape == (19, 64) for t in saved)
    for a, b in zip(outs_q, outs):
        assert torch.equal(a, b)
    assert torch.equal(grads_q[0], grads[0])                      # dX
    reads_x = {0, 2, 4} if op == "qkv" else {0, 2}     # the adapters' A that multiply X (down's reads h)
    for i, (a, b) in enumerate(zip(grads_q[1:], grads[1:])):
        if i in reads_x:                                           # dA from the e4m3 copy of X
            assert 0 < (a - b).norm() / b.norm() < 0.06
        else:
            assert torch.equal(a, b)
