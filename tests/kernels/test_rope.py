import pytest
import torch

from kernels.ops.rope import rope, rope_reference
from tests.kernels._tolerances import assert_close


def _cos_sin(batch, seq, rot, dtype, offset=0):
    inv_freq = 1.0 / (10000 ** (torch.arange(0, rot, 2).float() / rot))
    positions = (torch.arange(seq).float() + offset)[None].expand(batch, seq)
    freqs = positions[..., None] * inv_freq
    emb = torch.cat([freqs, freqs], dim=-1)  # transformers' layout
    return emb.cos().to(dtype), emb.sin().to(dtype)


def _projected(batch, seq, heads, head_dim, dtype, seed):
    """A [b, h, s, d] transpose of a projection-like [b, s, h*d] tensor (what attention passes)."""
    torch.manual_seed(seed)
    leaf = torch.randn(batch, seq, heads * head_dim).to(dtype).requires_grad_()
    return leaf, lambda: (leaf * 1).view(batch, seq, heads, head_dim).transpose(1, 2)


def _run(fn, q_make, k_make, cos, sin, grad_q, grad_k, leaves):
    q_out, k_out = fn(q_make(), k_make(), cos, sin)
    grads = torch.autograd.grad((q_out * grad_q).sum() + (k_out * grad_k).sum(), leaves)
    return q_out.detach(), k_out.detach(), grads


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16])
@pytest.mark.parametrize("batch,seq,q_heads,k_heads,head_dim,rot,cos_batch", [
    (2, 37, 6, 2, 64, 64, 1),    # GQA, cos shared over the batch
    (3, 19, 4, 4, 48, 48, 3),    # MHA, per-sample positions
    (2, 23, 5, 1, 96, 48, 1),    # partial rotary (Phi-3 style), MQA
])
def test_rope_matches_reference(dtype, batch, seq, q_heads, k_heads, head_dim, rot, cos_batch):
    cos, sin = _cos_sin(cos_batch, seq, rot, dtype, offset=3)
    q_leaf, q_make = _projected(batch, seq, q_heads, head_dim, dtype, 1)
    k_leaf, k_make = _projected(batch, seq, k_heads, head_dim, dtype, 2)
    grad_q = torch.randn(batch, q_heads, seq, head_dim).to(dtype)
    grad_k = torch.randn(batch, k_heads, seq, head_dim).to(dtype)
    ours = _run(rope, q_make, k_make, cos, sin, grad_q, grad_k, [q_leaf, k_leaf])
    ref = _run(rope_reference, q_make, k_make, cos, sin, grad_q, grad_k, [q_leaf, k_leaf])
    for actual, expected in zip(ours[:2] + tuple(ours[2]), ref[:2] + tuple(ref[2])):
        assert_close(actual, expected, dtype)


def test_rope_rotates_in_place():
    cos, sin = _cos_sin(1, 5, 8, torch.float32)
    q = torch.randn(1, 2, 5, 8)
    k = torch.randn(1, 1, 5, 8)
    expected_q, expected_k = rope_reference(q, k, cos, sin)
    q_out, k_out = rope(q, k, cos, sin)
    assert q_out.data_ptr() == q.data_ptr() and k_out.data_ptr() == k.data_ptr()
    torch.testing.assert_close(q, expected_q)
    torch.testing.assert_close(k, expected_k)


def test_rope_refuses_odd_rotary_dim():
    cos, sin = _cos_sin(1, 4, 8, torch.float32)
    with pytest.raises(ValueError, match="rotary dim"):
        rope(torch.randn(1, 2, 4, 6), torch.randn(1, 2, 4, 6), cos, sin)
