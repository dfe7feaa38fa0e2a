"""The fused LoRA ops cast fp32 adapters (PEFT's autocast_adapter_dtype) to the compute dtype once per
forward and backward reuses those casts (saved with the node), and they make no Tensor.to call that
would return its input: the same values as casting at every use, fewer launches and host calls a step
(bench/NOTES.md, KTO host time). Bitwise: fp32 adapters give exactly what their bf16 copies give (the
gradients those copies get, widened), on the ops and on a patched tiny Llama."""
import copy

import pytest
import torch
from torch.utils._python_dispatch import TorchDispatchMode

from kernels.ops import lora_mlp as mlp_module
from kernels.ops.lora_mlp import lora_mlp
from kernels.ops.lora_o import lora_o
from kernels.ops.lora_qkv import lora_qkv
from tests.kernels.lora_cases import projection
from tests.kernels.tiny_peft import TARGETS

HIDDEN, INTER = 64, 96


def _projections(op, rank):
    torch.manual_seed(3)
    if op == "qkv":
        return [projection(HIDDEN, HIDDEN, torch.bfloat16, rank), projection(32, HIDDEN, torch.bfloat16, rank),
                projection(32, HIDDEN, torch.bfloat16, rank)]
    if op == "o":
        return [projection(HIDDEN, HIDDEN, torch.bfloat16, rank)]
    return [projection(INTER, HIDDEN, torch.bfloat16, rank), projection(INTER, HIDDEN, torch.bfloat16, rank),
            projection(HIDDEN, INTER, torch.bfloat16, rank)]


def _forward(op, x, projections) -> tuple:
    """The op's outputs as a tuple (lora_qkv gives three, lora_o and lora_mlp one)."""
    if op == "qkv":
        return lora_qkv(x, *projections)
    if op == "o":
        p = projections[0]
        return (lora_o(x, p.weight, p.lora_A, p.lora_B, p.scaling, p.bias),)
    return (lora_mlp(x, *projections),)


def _run(op, x, projections):
    x = x.clone().requires_grad_()
    outs = _forward(op, x, projections)
    params = [t for p in projections for t in (p.lora_A, p.lora_B)]
    upstream = [torch.randn(o.shape, generator=torch.Generator().manual_seed(i)).to(o.dtype)
                for i, o in enumerate(outs)]
    return outs, torch.autograd.grad(outs, [x] + params, upstream)


def _as_copies(projections, dtype):
    return [p._replace(lora_A=p.lora_A.detach().to(dtype).requires_grad_(),
                       lora_B=p.lora_B.detach().to(dtype).requires_grad_()) for p in projections]


# the fused down-LoRA backward (FUSE_DOWN_LORA_BACKWARD) is an MLP path for ranks of 2^k only
@pytest.mark.parametrize("op,rank,fuse_down", [(op, rank, False) for op in ("qkv", "o", "mlp") for rank in (5, 16)]
                         + [("mlp", 16, True)])
def test_fp32_adapters_give_what_their_bf16_copies_give_bitwise(op, rank, fuse_down, monkeypatch):
    monkeypatch.setattr(mlp_module, "FUSE_DOWN_LORA_BACKWARD", fuse_down)
    projections = _projections(op, rank)
    x = torch.randn(2, 9, HIDDEN).to(torch.bfloat16)
    outs, grads = _run(op, x, projections)
    outs_c, grads_c = _run(op, x, _as_copies(projections, torch.bfloat16))
    for a, b in zip(outs, outs_c):
        assert torch.equal(a, b)
    assert torch.equal(grads[0], grads_c[0])                  # dX
    for a, b in zip(grads[1:], grads_c[1:]):                  # dA, dB: fp32, the bf16 values widened
        assert a.dtype == torch.float32 and torch.equal(a, b.float())


class _Casts(TorchDispatchMode):
    """Counts aten._to_copy calls from fp32 to bf16 (adapter casts)."""

    def __init__(self):
        super().__init__()
        self.narrowing = 0

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        if func is torch.ops.aten._to_copy.default and args[0].dtype == torch.float32 \
                and kwargs.get("dtype") == torch.bfloat16:
            self.narrowing += 1
        return func(*args, **kwargs)


@pytest.mark.parametrize("op", ["qkv", "o", "mlp"])
def test_each_adapter_is_cast_once_in_forward_and_never_in_backward(op):
    projections = _projections(op, 16)
    x = torch.randn(2, 9, HIDDEN).to(torch.bfloat16).requires_grad_()
    forward = _Casts()
    with forward:
        outs = _forward(op, x, projections)
    assert forward.narrowing == 2 * len(projections)           # each A and each B once
    backward = _Casts()
    with backward:
        torch.autograd.backward(outs, [torch.ones_like(o) for o in outs])
    assert backward.narrowing == 0


def test_a_patched_llama_step_is_unchanged_and_calls_no_idle_casts(monkeypatch):
    """A tiny Llama under patch_lora_layers, bf16 with fp32 adapters: loss and LoRA gradients equal
    those of the same model with bf16 copies of its adapters (bitwise), and the fused forward and
    backward make no Tensor.to call that returns its input."""
    transformers = pytest.importorskip("transformers")
    peft = pytest.importorskip("peft")
    from kernels.lora_patch import patch_lora_layers
    from kernels.report import PatchReport

    config = transformers.LlamaConfig(vocab_size=97, hidden_size=48, intermediate_size=80, num_hidden_layers=2,
                                      num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=64)
    torch.manual_seed(0)
    base = transformers.LlamaForCausalLM(config).to(torch.bfloat16)
    torch.manual_seed(1)
    model = peft.get_peft_model(base, peft.LoraConfig(r=16, lora_alpha=32, lora_dropout=0.0, target_modules=TARGETS))
    for name, param in model.named_parameters():
        if "lora_B" in name:
            torch.nn.init.normal_(param, std=0.1)
    copies = copy.deepcopy(model)
    for name, param in copies.named_parameters():
        if "lora_" in name:
            param.data = param.data.to(torch.bfloat16)
    assert {p.dtype for n, p in model.named_parameters() if "lora_" in n} == {torch.float32}
    for m in (model, copies):
        patch_lora_layers(m, PatchReport(backend="triton", architecture="llama"), use_triton=True)

    idle = []
    real_to = torch.Tensor.to

    def to(self, *args, **kwargs):
        out = real_to(self, *args, **kwargs)
        caller = __import__("sys")._getframe(1).f_code.co_filename
        if out is self and "/kernels/" in caller.replace("\\", "/"):
            idle.append(caller)
        return out

    def step(m):
        ids = torch.randint(0, 97, (2, 13), generator=torch.Generator().manual_seed(2))
        loss = m(input_ids=ids, labels=ids).loss
        loss.backward()
        return loss.detach(), {n: p.grad for n, p in m.named_parameters() if p.grad is not None}

    monkeypatch.setattr(torch.Tensor, "to", to)
    loss, grads = step(model)
    monkeypatch.undo()
    assert idle == []
    loss_c, grads_c = step(copies)
    assert torch.equal(loss, loss_c)
    assert grads.keys() == grads_c.keys() and len(grads) == 2 * 2 * len(TARGETS)
    for name, grad in grads.items():
        assert grad.dtype == torch.float32 and torch.equal(grad, grads_c[name].float()), name
    from kernels.ops import _lora_common   # two passes in one step (step_casts): the second reuses the casts
    monkeypatch.setattr(_lora_common, "CACHE_STEP_CASTS", True)
    model.zero_grad(set_to_none=True)
    with _lora_common.step_casts():
        step(model)
        loss_twice, grads_twice = step(model)
    assert torch.equal(loss_twice, loss)
    for name, grad in grads_twice.items():
        assert torch.equal(grad, 2 * grads[name]), name


@pytest.mark.parametrize("op", ["qkv", "mlp"])
def test_within_step_casts_a_second_forward_casts_nothing_and_the_next_step_sees_an_update(op, monkeypatch):
    """step_casts with CACHE_STEP_CASTS (kernels/ops/_lora_common.py): the step's second forward (a recompute,
    KTO's KL pass) reuses the first's casts and gives the same outputs and gradients; an in-place update that
    no tensor version records (as torch's fused AdamW makes) between two steps is seen by the next one."""
    from kernels.ops import _lora_common
    monkeypatch.setattr(_lora_common, "CACHE_STEP_CASTS", True)
    projections = _projections(op, 16)
    x = torch.randn(2, 9, HIDDEN).to(torch.bfloat16)
    with _lora_common.step_casts():
        first, again = _Casts(), _Casts()
        with first:
            outs, grads = _run(op, x, projections)
        with again:
            outs_again, grads_again = _run(op, x, projections)
    # each A and B once in the step (the rest: _run's upstream gradients, one per output)
    assert first.narrowing == 2 * len(projections) + len(outs) and again.narrowing == len(outs)
    assert all(torch.equal(a, b) for a, b in zip(outs + grads, outs_again + grads_again))
    for p in projections:
        p.lora_B.data.add_(0.5)   # .data: no version bump
    with _lora_common.step_casts():
        updated, _ = _run(op, x, projections)
    monkeypatch.setattr(_lora_common, "CACHE_STEP_CASTS", False)
    fresh, _ = _run(op, x, projections)
    assert all(torch.equal(a, b) for a, b in zip(updated, fresh)) and not torch.equal(updated[0], outs[0])
