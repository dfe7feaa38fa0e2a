"""QLoRA: a tiny Llama whose decoder Linears are bitsandbytes NF4 (double-quantized) Linear4bit,
with PEFT LoRA on top. Fused (lora ops + NF4 dequant kernel + fused loss) vs unpatched PEFT:
same loss and LoRA gradients; and a short training run whose loss falls."""
import copy

import pytest
import torch

bnb = pytest.importorskip("bitsandbytes")
peft = pytest.importorskip("peft")
transformers = pytest.importorskip("transformers")

from kernels.lora_patch import patch_lora_layers  # noqa: E402
from kernels.loss_patch import patch_causal_lm_loss  # noqa: E402
from kernels.report import PatchReport  # noqa: E402

TARGETS = ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"]
VOCAB = 97


@pytest.fixture(autouse=True, scope="module")
def one_torch_thread():
    """With bitsandbytes' CPU library loaded next to torch, two OpenMP pools spin against each
    other on this 2-core CI box and every small torch.mm takes ~30 ms (1000x); one thread avoids it."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


def _to_nf4(linear: torch.nn.Linear, dtype) -> torch.nn.Module:
    quantized = bnb.nn.Linear4bit(linear.in_features, linear.out_features, bias=False,
                                  compute_dtype=dtype, quant_type="nf4", compress_statistics=True)
    quantized.weight = bnb.nn.Params4bit(linear.weight.data.to(dtype), requires_grad=False,
                                         quant_type="nf4", compress_statistics=True, blocksize=64)
    return quantized.to("cpu")   # quantizes


def tiny_qlora_base(dtype):
    # widths that are multiples of 64: bitsandbytes' CPU dequantization is right there (test_nf4.py)
    config = transformers.LlamaConfig(vocab_size=VOCAB, hidden_size=64, intermediate_size=128,
                                      num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
                                      initializer_range=0.1)   # logits big enough to learn fast
    torch.manual_seed(0)
    model = transformers.LlamaForCausalLM(config).to(dtype)
    for layer in model.model.layers:
        for parent in (layer.self_attn, layer.mlp):
            for name, child in list(parent.named_children()):
                if isinstance(child, torch.nn.Linear):
                    setattr(parent, name, _to_nf4(child, dtype))
    return model


def with_lora(base):
    torch.manual_seed(1)
    model = peft.get_peft_model(copy.deepcopy(base), peft.LoraConfig(
        r=5, lora_alpha=10, lora_dropout=0.0, target_modules=TARGETS))
    for name, param in model.named_parameters():
        if "lora_B" in name:
            torch.nn.init.normal_(param, std=0.1)
    return model


def fused(model):
    report = PatchReport(backend="triton")
    patch_lora_layers(model, report, use_triton=True)
    patch_causal_lm_loss(model, report, use_triton=True)
    assert not report.fallbacks, str(report)
    return model


def test_peft_layers_are_bnb_4bit():
    model = with_lora(tiny_qlora_base(torch.float32))
    q_proj = model.base_model.model.model.layers[0].self_attn.q_proj
    # PEFT wraps it in lora.bnb.Linear4bit where bitsandbytes has a GPU, else in lora.Linear
    assert type(q_proj.base_layer).__name__ == "Linear4bit"
    assert q_proj.base_layer.weight.quant_state.nested


@pytest.mark.parametrize("dtype, tol", [(torch.float32, 1e-4), (torch.bfloat16, 3e-2)])
def test_qlora_fused_matches_peft(dtype, tol):
    base = tiny_qlora_base(dtype)
    reference, patched = with_lora(base), fused(with_lora(base))
    ids = torch.randint(0, VOCAB, (2, 13), generator=torch.Generator().manual_seed(2))
    labels = ids.clone()
    labels[0, :4] = -100
    ref_loss = reference(input_ids=ids, labels=labels).loss
    loss = patched(input_ids=ids, labels=labels).loss
    torch.testing.assert_close(loss, ref_loss, rtol=tol, atol=tol)
    ref_loss.backward()
    loss.backward()
    grads = {n: p.grad for n, p in patched.named_parameters() if p.grad is not None}
    ref_grads = {n: p.grad for n, p in reference.named_parameters() if p.grad is not None}
    assert grads.keys() == ref_grads.keys() and len(grads) == 2 * 2 * len(TARGETS)
    for name, grad in grads.items():
        assert grad.dtype == ref_grads[name].dtype
        err = ((grad.float() - ref_grads[name].float()).abs().max() / ref_grads[name].float().abs().max()).item()
        assert err < 3 * tol, f"{name}: relative error {err:.2e}"


def test_qlora_with_fp32_norms_computes_in_the_nf4_dtype():
    """prepare_model_for_kbit_training keeps norms/embeddings/head in fp32, so the LoRA layers see
    fp32 inputs over bf16 NF4 weights: the fused path computes in bf16, returns fp32, like bitsandbytes."""
    base = tiny_qlora_base(torch.bfloat16)
    for param in base.parameters():
        if getattr(param, "quant_state", None) is None:
            param.data = param.data.float()
    reference, patched = with_lora(base), fused(with_lora(base))
    ids = torch.randint(0, VOCAB, (2, 13), generator=torch.Generator().manual_seed(4))
    ref_loss, loss = reference(input_ids=ids, labels=ids).loss, patched(input_ids=ids, labels=ids).loss
    assert loss.dtype == torch.float32
    torch.testing.assert_close(loss, ref_loss, rtol=2e-2, atol=2e-2)
    ref_loss.backward()
    loss.backward()
    for (name, param), ref_param in zip(patched.named_parameters(), reference.parameters()):
        if param.grad is not None:
            err = (param.grad - ref_param.grad).abs().max() / ref_param.grad.abs().max()
            assert param.grad.dtype == torch.float32 and err < 6e-2, f"{name}: {err:.2e}"


def _train(model, steps=20):
    ids = (torch.arange(16) * 5 % 13 + 3).repeat(2, 1)   # a learnable, repeating sequence
    optimizer = torch.optim.AdamW([p for p in model.parameters() if p.requires_grad], lr=3e-2)
    losses = []
    for _ in range(steps):
        loss = model(input_ids=ids, labels=ids).loss
        loss.backward()
        optimizer.step()
        optimizer.zero_grad()
        losses.append(loss.item())
    return losses


def test_qlora_training_loss_falls_like_peft():
    base = tiny_qlora_base(torch.float32)
    losses = _train(fused(with_lora(base)))
    reference = _train(with_lora(base))
    assert losses[-1] < 0.5 * losses[0], losses
    torch.testing.assert_close(torch.tensor(losses), torch.tensor(reference), rtol=2e-3, atol=2e-3)
