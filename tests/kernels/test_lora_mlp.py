"""lora_mlp (gate/up LoRA, SwiGLU or GeGLU-tanh, down LoRA) vs plain PyTorch, forward and backward."""
import pytest
import torch

from kernels.ops.lora_mlp import lora_mlp, lora_mlp_reference
from tests.kernels.lora_cases import REL_TOL, compare_op, projection

HIDDEN, INTER = 341, 203


def _mlp(dtype, lora=(True, True, True), rank=5):
    return [projection(INTER, HIDDEN, dtype, rank, lora[0]), projection(INTER, HIDDEN, dtype, rank, lora[1]),
            projection(HIDDEN, INTER, dtype, rank, lora[2])]


@pytest.mark.parametrize("activation", ["swiglu", "geglu"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16])
def test_lora_mlp_matches_reference(dtype, activation):
    torch.manual_seed(0)
    x = torch.randn(3, 37, HIDDEN).to(dtype)
    compare_op(lora_mlp, lora_mlp_reference, x, _mlp(dtype), REL_TOL[dtype], activation=activation)


@pytest.mark.parametrize("lora", [(False, True, False), (True, False, True), (False, False, True)])
def test_lora_mlp_with_some_projections_frozen(lora):
    """target_modules that cover only part of the MLP: the others are plain frozen GEMMs."""
    torch.manual_seed(1)
    x = torch.randn(2, 19, HIDDEN)
    compare_op(lora_mlp, lora_mlp_reference, x, _mlp(torch.float32, lora), REL_TOL[torch.float32])


def test_lora_mlp_large_activations_stay_finite():
    """silu/gelu-tanh at |e| ~ 50: the exp-based tanh and sigmoid must saturate, not overflow."""
    torch.manual_seed(2)
    x = torch.randn(5, HIDDEN) * 40
    for activation in ("swiglu", "geglu"):
        compare_op(lora_mlp, lora_mlp_reference, x, _mlp(torch.float32), REL_TOL[torch.float32],
                   activation=activation)


@pytest.mark.parametrize("activation", ["swiglu", "geglu"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16])
def test_lora_mlp_rank16_adds_gate_up_lora_inside_the_activation_kernel(dtype, activation, monkeypatch):
    """rank 16 (a power of two >= 16) takes the fused LoRA-add + activation kernel."""
    from kernels.ops import lora_mlp as module
    calls = []
    real = module._lora_act_
    monkeypatch.setattr(module, "_lora_act_", lambda *a, **k: calls.append(1) or real(*a, **k))
    x = torch.randn(3, 37, HIDDEN).to(dtype)
    compare_op(lora_mlp, lora_mlp_reference, x, _mlp(dtype, rank=16), REL_TOL[dtype], activation=activation)
    assert calls


def test_lora_mlp_rejects_unknown_activation():
    with pytest.raises(ValueError, match="activation"):
        lora_mlp(torch.randn(2, HIDDEN), *_mlp(torch.float32), activation="relu")



@pytest.mark.parametrize("rank", [16, 5])   # the fused LoRA + activation kernel, and the addmm_ + flat kernel
def test_lora_mlp_without_grad_writes_h_over_e_and_gives_the_same_output(rank, monkeypatch):
    """A forward without grad (a checkpointed layer's first pass, sampling) keeps no adapter terms in e
    and g for a backward and writes h over e, one [M, I] buffer fewer: the output is the grad-mode
    output bit for bit."""
    from kernels.ops import lora_mlp as module
    name = "_lora_act_" if rank == 16 else "_act_mul"
    over_e, real = [], getattr(module, name)
    monkeypatch.setattr(module, name, lambda e, *a: over_e.append(e.data_ptr() == (h := real(e, *a)).data_ptr()) or h)
    torch.manual_seed(3)
    x, mlp = torch.randn(2, 23, HIDDEN), _mlp(torch.float32, rank=rank)
    with_grad = lora_mlp(x, *mlp)
    with torch.no_grad():
        without = lora_mlp(x, *mlp)
    torch.testing.assert_close(without, with_grad.detach(), rtol=0, atol=0)
    assert over_e == [False, True] and with_grad.requires_grad
