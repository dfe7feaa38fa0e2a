"""A gated activation (SwiGLU, GeGLU) against its reference, forward and backward (shared by their tests)."""
import torch

from tests.kernels._tolerances import assert_close


def check_gated(op, reference, dtype, shape, fused_halves):
    """op vs reference, forward and backward, on projection-like inputs (Phi-3's fused
    gate_up halves when `fused_halves`, else two separate tensors)."""
    torch.manual_seed(shape[-1])
    width = shape[-1]
    leaf = (torch.randn(*shape[:-1], 2 * width) * 3).to(dtype).requires_grad_()
    grad_out = torch.randn(shape).to(dtype)

    def run(fn):
        both = leaf * 1  # an intermediate, like a projection output
        gate, up = both.chunk(2, dim=-1) if fused_halves else (both[..., :width].contiguous(),
                                                              both[..., width:].contiguous())
        out = fn(gate, up)
        (grad,) = torch.autograd.grad((out * grad_out).sum(), leaf)
        return out.detach(), grad

    out, grad = run(op)
    out_ref, grad_ref = run(reference)
    assert_close(out, out_ref, dtype, scale=4.0)
    assert_close(grad, grad_ref, dtype, scale=4.0)
