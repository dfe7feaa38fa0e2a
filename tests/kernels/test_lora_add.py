"""lora_add (y += s (X A^T) B^T in place, tile-wise Triton) vs PyTorch, and the fused LoRA ops
that use it for q/k/v/o/down, forward and backward, at rank 16 where the kernel runs."""
import pytest
import torch

from kernels.ops import lora_add as lora_add_module
from kernels.ops.lora_add import lora_add, lora_add_, lora_add_reference
from kernels.ops.lora_mlp import lora_mlp, lora_mlp_reference
from kernels.ops.lora_o import lora_o_reference
from kernels.ops.lora_qkv import lora_qkv, lora_qkv_reference
from tests.kernels.lora_cases import REL_TOL, assert_rel_close, compare_op, projection

M, OUT, WIDE = 77, 203, 53   # odd: ragged row and column tiles; xa a column slice of a wider [M, 53]


@pytest.fixture
def launches(monkeypatch):
    """Counts Triton launches, so a test fails if the op silently fell back to addmm_."""
    calls = []
    real = lora_add_module._launch
    monkeypatch.setattr(lora_add_module, "_launch", lambda *a: (calls.append(a[1].shape), real(*a)))
    return calls


def _inputs(dtype, rank, seed=0):
    torch.manual_seed(seed)
    y = torch.randn(M, OUT).to(dtype)
    xa = torch.randn(M, WIDE).to(dtype)[:, 5:5 + rank]   # stride(0) = 53, like the shared [M, 3r] XA
    lora_B = (torch.randn(OUT, rank) * 0.3).to(dtype)
    return y, xa, lora_B


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16])
@pytest.mark.parametrize("rank", [16, 32])
def test_lora_add_in_place_matches_reference(dtype, rank, launches):
    y, xa, lora_B = _inputs(dtype, rank)
    expected = lora_add_reference(y.float(), xa.float(), lora_B.float(), 1.7)
    out = lora_add_(y, xa, lora_B, 1.7)
    assert out.data_ptr() == y.data_ptr() and launches == [(M, rank)]
    assert_rel_close(out, expected, REL_TOL[dtype], f"{dtype} rank {rank}")


@pytest.mark.parametrize("rank", [5, 16])
def test_lora_add_falls_back_to_addmm_where_the_kernel_does_not_apply(rank, launches, monkeypatch):
    """rank 5 (not a power of two >= 16), or BACKEND = "addmm": same result through cuBLAS/ATen."""
    monkeypatch.setattr(lora_add_module, "BACKEND", "addmm" if rank == 16 else "triton")
    y, xa, lora_B = _inputs(torch.float32, rank, seed=1)
    expected = lora_add_reference(y, xa, lora_B, 0.5)
    assert_rel_close(lora_add_(y, xa, lora_B, 0.5), expected, REL_TOL[torch.float32])
    assert launches == []


def test_lora_add_rejects_mismatched_shapes():
    y, xa, lora_B = _inputs(torch.float32, 16)
    with pytest.raises(ValueError, match="do not fit"):
        lora_add_(y, xa, lora_B[:-1], 1.0)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16])
def test_lora_add_autograd_matches_reference(dtype, launches):
    y0, xa0, b0 = _inputs(dtype, 16, seed=2)
    leaves = [t.clone().requires_grad_() for t in (y0, xa0, b0)]
    ref_leaves = [t.clone().requires_grad_() for t in (y0, xa0, b0)]
    out = lora_add(leaves[0].clone(), leaves[1], leaves[2], 2.0)
    ref = lora_add_reference(*ref_leaves, 2.0)
    upstream = torch.randn_like(ref)
    grads = torch.autograd.grad(out, leaves, upstream)
    ref_grads = torch.autograd.grad(ref, ref_leaves, upstream)
    assert launches == [(M, 16)]
    assert_rel_close(out, ref, REL_TOL[dtype], "forward")
    for name, a, b in zip(("dy", "dxa", "dB"), grads, ref_grads):
        assert_rel_close(a, b, REL_TOL[dtype], name)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16])
def test_lora_qkv_rank16_adds_lora_with_the_kernel(dtype, launches):
    torch.manual_seed(3)
    x = torch.randn(3, 37, 341).to(dtype)
    qkv = [projection(341, 341, dtype, 16), projection(93, 341, dtype, 16, bias=True),
           projection(93, 341, dtype, 16)]
    compare_op(lora_qkv, lora_qkv_reference, x, qkv, REL_TOL[dtype])
    assert launches == [(111, 16)] * 3


def test_lora_o_rank16_adds_lora_with_the_kernel(launches):
    from kernels.ops.lora_o import lora_o
    torch.manual_seed(4)
    x = torch.randn(2, 29, 203, dtype=torch.float16)
    (p,) = [projection(341, 203, torch.float16, 16)]
    compare_op(lambda x_, q: lora_o(x_, *q[:4]), lambda x_, q: lora_o_reference(x_, *q[:4]), x, [p],
               REL_TOL[torch.float16])
    assert launches == [(58, 16)]


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16])
def test_lora_mlp_rank16_down_projection_uses_the_kernel(dtype, launches):
    torch.manual_seed(5)
    x = torch.randn(2, 19, 341).to(dtype)
    mlp = [projection(203, 341, dtype, 16), projection(203, 341, dtype, 16), projection(341, 203, dtype, 16)]
    compare_op(lora_mlp, lora_mlp_reference, x, mlp, REL_TOL[dtype])
    assert launches == [(38, 16)]   # gate/up ride in the activation kernel; only down is added here


@pytest.mark.parametrize("activation", ["swiglu", "geglu"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16])
def test_lora_mlp_rank16_backward_adds_the_down_term_inside_the_activation_kernel(dtype, activation,
                                                                                  monkeypatch):
    """Backward (opt-in path): dh += (sd dY Bd) Ad inside the activation-backward kernel; grads vs reference."""
    from kernels.ops import lora_mlp as module
    monkeypatch.setattr(module, "FUSE_DOWN_LORA_BACKWARD", True)   # off by default (slower on the H200)
    calls = []
    real = module._lora_act_backward_
    monkeypatch.setattr(module, "_lora_act_backward_", lambda *a: (calls.append(a[3].shape), real(*a)))
    torch.manual_seed(6)
    x = torch.randn(3, 13, 341).to(dtype)
    mlp = [projection(203, 341, dtype, 16), projection(203, 341, dtype, 16), projection(341, 203, dtype, 16)]
    compare_op(lora_mlp, lora_mlp_reference, x, mlp, REL_TOL[dtype], activation=activation)
    assert calls == [(39, 16)]


def test_lora_mlp_backward_default_keeps_the_flat_activation_kernel(monkeypatch):
    """Default (measured faster on the H200): addmm_ for the down term, then the flat kernel."""
    from kernels.ops import lora_mlp as module
    calls = []
    monkeypatch.setattr(module, "_lora_act_backward_", lambda *a: calls.append(1))
    torch.manual_seed(7)
    x = torch.randn(2, 11, 341)
    mlp = [projection(203, 341, torch.float32, 16), projection(203, 341, torch.float32, 16),
           projection(341, 203, torch.float32, 16)]
    compare_op(lora_mlp, lora_mlp_reference, x, mlp, REL_TOL[torch.float32])
    assert calls == []
