"""patch_model(..., base_precision="fp8") on tiny PEFT Llamas (CPU, Triton interpreter, emulated FP8
products): which layers become FP8, the report, the fallbacks with their reasons, agreement with
the unquantized model and with the unfused PEFT path, checkpointing, and a training run."""
import copy

import pytest
import torch

transformers = pytest.importorskip("transformers")
peft = pytest.importorskip("peft")

from kernels import apply_checkpointing, patch_model  # noqa: E402
from kernels.fp8_patch import quantize_base_fp8  # noqa: E402
from kernels.ops import fp8_linear  # noqa: E402
from kernels.ops.fp8_linear import Fp8Linear, fp8_gemm_supported  # noqa: E402
from kernels.report import PatchReport  # noqa: E402

TARGETS = ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"]


def tiny_llama():
    # multiples of 16 everywhere (the FP8 GEMM's tile rule); k/v 2 heads x 16 = 32
    config = transformers.LlamaConfig(vocab_size=97, hidden_size=64, intermediate_size=96, num_hidden_layers=2,
                                      num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=64)
    torch.manual_seed(0)
    return transformers.LlamaForCausalLM(config)


def with_lora(base, targets=TARGETS):
    torch.manual_seed(1)
    config = peft.LoraConfig(r=16, lora_alpha=16, lora_dropout=0.0, target_modules=targets)
    model = peft.get_peft_model(copy.deepcopy(base), config)
    for name, param in model.named_parameters():
        if "lora_B" in name:
            torch.nn.init.normal_(param, std=0.05)
    return model


def batch(seed=2):
    return torch.randint(0, 97, (2, 13), generator=torch.Generator().manual_seed(seed))


def step(model, x):
    model.zero_grad(set_to_none=True)
    loss = model(input_ids=x, labels=x).loss
    loss.backward()
    return float(loss.detach()), {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None}


def rel(a, b):
    return float((a - b).norm() / b.norm())


def test_fp8_patch_swaps_every_decoder_linear_and_reports_them():
    model = with_lora(tiny_llama())
    report = patch_model(model, backend="triton", base_precision="fp8")
    fp8 = {e.op: e.modules for e in report.entries if e.op.startswith("fp8_linear") and e.backend == "triton"}
    assert fp8 == {f"fp8_linear[{name}]": 2 for name in TARGETS}
    assert any("FP8 base weights" in n and "GB" in n for n in report.notes)
    layer = model.base_model.model.model.layers[0]
    assert isinstance(layer.self_attn.q_proj.base_layer, Fp8Linear)
    assert isinstance(layer.mlp.down_proj.base_layer, Fp8Linear)
    assert type(model.base_model.model.lm_head) is torch.nn.Linear          # read by the fused loss in bf16
    assert {"lora_qkv", "lora_mlp", "lora_o"} <= set(report.triton_ops)     # fused on the FP8 bases
    assert "  triton  fp8_linear[q_proj] x2" in report.lines()
    # the saved adapter and the trainable parameters are exactly those of the bf16 model
    reference = with_lora(tiny_llama())
    assert [n for n, p in model.named_parameters() if p.requires_grad] == \
           [n for n, p in reference.named_parameters() if p.requires_grad]


def test_fp8_loss_and_grads_are_close_to_the_unquantized_model():
    base = tiny_llama()
    exact, quantized = with_lora(base), with_lora(base)
    patch_model(quantized, backend="triton", base_precision="fp8")
    x = batch()
    loss_exact, grads_exact = step(exact, x)
    loss_fp8, grads_fp8 = step(quantized, x)
    assert abs(loss_fp8 - loss_exact) / loss_exact < 1e-2   # the first-step criterion
    assert loss_fp8 != loss_exact
    worst = max(rel(grads_fp8[n], g) for n, g in grads_exact.items())
    assert worst < 0.15, worst


def test_fused_fp8_matches_the_unfused_peft_path_through_fp8_linear():
    """Same FP8 weights, PEFT's own forward (Fp8Linear.forward per projection) vs the fused ops:
    the forward quantizes identically; backward differs only by quantizing dQ/dK/dV (and d gate,
    d up) jointly per row instead of one projection at a time."""
    base = tiny_llama()
    unfused = with_lora(base)
    quantize_base_fp8(unfused, PatchReport(backend="triton"), use_triton=True)
    fused = copy.deepcopy(unfused)
    patch_model(fused, backend="triton", base_precision="fp8")
    x = batch(3)
    loss_a, grads_a = step(unfused, x)
    loss_b, grads_b = step(fused, x)
    assert abs(loss_a - loss_b) / loss_a < 1e-5
    assert max(rel(grads_b[n], g) for n, g in grads_a.items()) < 0.05


def test_projections_without_adapters_also_run_in_fp8():
    model = with_lora(tiny_llama(), targets=["q_proj", "v_proj"])
    report = patch_model(model, backend="triton", base_precision="fp8")
    counts = {e.op: e.modules for e in report.entries if e.op.startswith("fp8_linear")}
    assert counts == {f"fp8_linear[{name}]": 2 for name in TARGETS}
    mlp = model.base_model.model.model.layers[1].mlp
    assert isinstance(mlp.gate_proj, Fp8Linear)
    loss, grads = step(model, batch())
    assert torch.isfinite(torch.tensor(loss)) and len(grads) == 2 * 2 * 2


def test_checkpointing_recomputes_the_same_fp8_step():
    base = tiny_llama()
    plain, checkpointed = with_lora(base), with_lora(base)
    for model in (plain, checkpointed):
        patch_model(model, backend="triton", base_precision="fp8")
    apply_checkpointing(checkpointed, "on")
    checkpointed.train()
    x = batch(4)
    loss_a, grads_a = step(plain, x)
    loss_b, grads_b = step(checkpointed, x)
    assert loss_a == pytest.approx(loss_b, rel=1e-6)
    assert max(rel(grads_b[n], g) for n, g in grads_a.items()) < 1e-5


def test_fp8_training_lowers_the_loss():
    model = with_lora(tiny_llama())
    patch_model(model, backend="triton", base_precision="fp8")
    # issue 41: 6 steps at 1e-2 (was 12 at 5e-3, 0.78x; each interpreted step takes seconds);
    # measured 4.575 -> 3.775 (0.83x), lower at every step
    opt = torch.optim.AdamW([p for p in model.parameters() if p.requires_grad], lr=1e-2)
    x = batch(5)
    losses = []
    for _ in range(6):
        loss, _ = step(model, x)
        opt.step()
        losses.append(loss)
    assert losses[-1] < 0.85 * losses[0] and losses == sorted(losses, reverse=True), losses


def test_torch_backend_and_plain_cpu_keep_bf16_and_say_why():
    model = with_lora(tiny_llama())
    report = patch_model(model, backend="torch", base_precision="fp8")
    (entry,) = [e for e in report.entries if e.op == "fp8_linear"]
    assert entry.backend == "torch" and "Triton" in entry.reason and "stay bf16" in entry.reason
    assert type(model.base_model.model.model.layers[0].self_attn.q_proj.base_layer) is torch.nn.Linear
    with pytest.raises(ValueError, match="base_precision"):
        patch_model(model, backend="torch", base_precision="fp4")


def test_gpu_capability_rule(monkeypatch):
    ok, reason = fp8_gemm_supported(torch.device("cpu"))
    assert not ok and "CUDA" in reason
    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda device=None: (8, 0))
    monkeypatch.setattr(torch.cuda, "get_device_name", lambda device=None: "NVIDIA A100")
    ok, reason = fp8_gemm_supported(torch.device("cuda"))
    assert not ok and "8.9" in reason and "A100 is 8.0" in reason
    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda device=None: (9, 0))
    assert fp8_gemm_supported(torch.device("cuda")) == (hasattr(torch, "_scaled_mm"),
                                                        "" if hasattr(torch, "_scaled_mm") else
                                                        f"torch {torch.__version__} has no torch._scaled_mm")
    assert fp8_linear.FP8_DTYPE == torch.float8_e4m3fn
