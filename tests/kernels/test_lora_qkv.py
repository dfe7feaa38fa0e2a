"""lora_qkv vs plain PyTorch LoRA: Q/K/V outputs and dX, dA, dB, forward and backward."""
import pytest
import torch

from kernels.ops.lora_qkv import lora_qkv, lora_qkv_reference
from tests.kernels.lora_cases import REL_TOL, compare_op, projection

HIDDEN, Q_OUT, KV_OUT = 341, 341, 93   # odd sizes; GQA: K/V narrower than Q


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16])
def test_lora_qkv_matches_reference(dtype):
    torch.manual_seed(0)
    x = torch.randn(3, 37, HIDDEN).to(dtype)
    qkv = [projection(Q_OUT, HIDDEN, dtype), projection(KV_OUT, HIDDEN, dtype, rank=3),
           projection(KV_OUT, HIDDEN, dtype, rank=7)]
    compare_op(lora_qkv, lora_qkv_reference, x, qkv, REL_TOL[dtype])


def test_lora_qkv_base_bias_and_missing_adapter():
    """Qwen2-style frozen q/k/v biases; K without an adapter is a plain frozen projection."""
    torch.manual_seed(1)
    x = torch.randn(2, 19, HIDDEN)
    qkv = [projection(Q_OUT, HIDDEN, torch.float32, bias=True),
           projection(KV_OUT, HIDDEN, torch.float32, lora=False, bias=True),
           projection(KV_OUT, HIDDEN, torch.float32, bias=True)]
    compare_op(lora_qkv, lora_qkv_reference, x, qkv, REL_TOL[torch.float32])


def test_lora_qkv_bf16_activations_fp32_adapters_give_fp32_grads():
    torch.manual_seed(2)
    x = torch.randn(37, HIDDEN, dtype=torch.bfloat16, requires_grad=True)
    qkv = [projection(Q_OUT, HIDDEN, torch.bfloat16) for _ in range(3)]
    q, k, v = lora_qkv(x, *qkv)
    (q.sum() + k.sum() + v.sum()).backward()
    assert q.dtype == torch.bfloat16 and x.grad.dtype == torch.bfloat16
    assert all(p.lora_A.grad.dtype == torch.float32 and p.lora_B.grad.dtype == torch.float32 for p in qkv)


def test_lora_qkv_second_backward_is_refused():
    x = torch.randn(5, HIDDEN, requires_grad=True)
    q, k, v = lora_qkv(x, *[projection(Q_OUT, HIDDEN, torch.float32) for _ in range(3)])
    loss = q.sum() + k.sum() + v.sum()
    loss.backward(retain_graph=True)
    with pytest.raises(RuntimeError, match="retain_graph"):
        loss.backward()


def test_lora_qkv_rejects_half_an_adapter():
    p = projection(Q_OUT, HIDDEN, torch.float32)
    with pytest.raises(ValueError, match="together"):
        lora_qkv(torch.randn(2, HIDDEN), p._replace(lora_B=None), p, p)
