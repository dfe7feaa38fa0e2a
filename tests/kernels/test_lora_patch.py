"""patch_lora_layers on tiny PEFT models: same loss and LoRA gradients as unpatched PEFT, the
attention seam, runtime fallbacks (disabled adapters), and the reported reasons."""
import copy

import pytest
import torch

transformers = pytest.importorskip("transformers")
peft = pytest.importorskip("peft")

from kernels.lora_patch import patch_lora_layers  # noqa: E402
from kernels.report import PatchReport  # noqa: E402
from tests.kernels.tiny_peft import TARGETS  # noqa: E402


def tiny_llama(**overrides):
    config = dict(vocab_size=97, hidden_size=48, intermediate_size=80, num_hidden_layers=2,
                  num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=64)
    torch.manual_seed(0)
    return transformers.LlamaForCausalLM(transformers.LlamaConfig(**{**config, **overrides}))


def with_lora(base, **lora_kwargs):
    """A PEFT copy of `base` whose lora_B is non-zero, so the adapters change the outputs."""
    torch.manual_seed(1)
    kwargs = dict(r=5, lora_alpha=10, lora_dropout=0.0, target_modules=TARGETS)
    model = peft.get_peft_model(copy.deepcopy(base), peft.LoraConfig(**{**kwargs, **lora_kwargs}))
    for name, param in model.named_parameters():
        if "lora_B" in name:
            torch.nn.init.normal_(param, std=0.1)
    return model


def loss_and_lora_grads(model, input_ids):
    labels = input_ids.clone()
    labels[0, :4] = -100
    loss = model(input_ids=input_ids, labels=labels).loss
    loss.backward()
    return loss.detach(), {n: p.grad for n, p in model.named_parameters() if p.grad is not None}


def assert_same_training_step(reference, patched, tol=1e-4):
    input_ids = torch.randint(0, 97, (2, 13), generator=torch.Generator().manual_seed(2))
    ref_loss, ref_grads = loss_and_lora_grads(reference, input_ids)
    loss, grads = loss_and_lora_grads(patched, input_ids)
    torch.testing.assert_close(loss, ref_loss, rtol=tol, atol=tol)
    assert grads.keys() == ref_grads.keys() and len(grads) == 2 * 2 * len(TARGETS)
    for name, grad in grads.items():
        err = (grad - ref_grads[name]).abs().max() / ref_grads[name].abs().max()
        assert err < tol, f"{name}: relative error {err:.2e}"


def test_patched_llama_matches_peft():
    base = tiny_llama()
    reference, patched = with_lora(base), with_lora(base)
    report = PatchReport(backend="triton")
    patch_lora_layers(patched, report, use_triton=True)
    counts = {e.op: e.modules for e in report.entries if e.backend == "triton"}
    assert counts == {"lora_qkv": 2, "lora_mlp": 2, "lora_o": 2}
    q_proj = patched.base_model.model.model.layers[0].self_attn.q_proj
    assert "forward" in q_proj.__dict__   # also fused alone, for attention forwards without the seam
    assert not report.fallbacks
    layer = patched.base_model.model.model.layers[0]
    assert "forward" in layer.mlp.__dict__ and "forward" in layer.self_attn.o_proj.__dict__
    assert patched.state_dict().keys() == reference.state_dict().keys()   # no extra submodules
    assert_same_training_step(reference, patched)


def test_qkv_seam_matches_the_three_projections():
    base = tiny_llama()
    reference, patched = with_lora(base), with_lora(base)
    patch_lora_layers(patched, PatchReport(backend="triton"), use_triton=True)
    ref_attn = reference.base_model.model.model.layers[1].self_attn
    attn = patched.base_model.model.model.layers[1].self_attn
    hidden = torch.randn(2, 7, 48)
    h_ref, h = hidden.clone().requires_grad_(), hidden.clone().requires_grad_()
    q, k, v = attn._fusetune_qkv(h)
    q_ref, k_ref, v_ref = ref_attn.q_proj(h_ref), ref_attn.k_proj(h_ref), ref_attn.v_proj(h_ref)
    for out, want in ((q, q_ref), (k, k_ref), (v, v_ref)):
        torch.testing.assert_close(out, want, rtol=1e-5, atol=1e-5)
    (q.sum() + 2 * k.sum() + 3 * v.sum()).backward()
    (q_ref.sum() + 2 * k_ref.sum() + 3 * v_ref.sum()).backward()
    torch.testing.assert_close(h.grad, h_ref.grad, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(attn.v_proj.lora_A["default"].weight.grad,
                               ref_attn.v_proj.lora_A["default"].weight.grad, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(attn._fusetune_o(q), ref_attn.o_proj(q_ref), rtol=1e-5, atol=1e-5)


def test_qwen2_style_qkv_bias_and_partial_targets_are_fused():
    base = tiny_llama(attention_bias=True)
    targets = ["q_proj", "v_proj", "up_proj"]   # k, o, gate, down stay plain frozen Linears
    reference, patched = with_lora(base, target_modules=targets), with_lora(base, target_modules=targets)
    report = PatchReport(backend="triton")
    patch_lora_layers(patched, report, use_triton=True)
    assert {e.op for e in report.entries} == {"lora_qkv", "lora_mlp"}
    ids = torch.randint(0, 97, (2, 9), generator=torch.Generator().manual_seed(3))
    ref_loss, ref_grads = loss_and_lora_grads(reference, ids)
    loss, grads = loss_and_lora_grads(patched, ids)
    torch.testing.assert_close(loss, ref_loss, rtol=1e-5, atol=1e-5)
    for name, grad in grads.items():
        torch.testing.assert_close(grad, ref_grads[name], rtol=1e-4, atol=1e-6)


def test_a_disabled_adapter_runs_the_fused_kernels_over_the_base_and_generation_falls_back(monkeypatch):
    """Under disable_adapter() (a DPO/KTO/GRPO reference pass) the fused ops run with no LoRA and
    give the base model's outputs; with the adapter back on, the LoRA outputs again."""
    import kernels.lora_patch as lora_patch
    base = tiny_llama()
    reference, patched = with_lora(base), with_lora(base)
    patch_lora_layers(patched, PatchReport(backend="triton"), use_triton=True)
    calls = {"lora_mlp": 0, "lora_o": 0}
    for name in calls:
        def counted(*args, _op=getattr(lora_patch, name), _name=name, **kwargs):
            calls[_name] += 1
            return _op(*args, **kwargs)
        monkeypatch.setattr(lora_patch, name, counted)
    ids = torch.randint(0, 97, (1, 6), generator=torch.Generator().manual_seed(4))
    with patched.disable_adapter(), reference.disable_adapter():
        off = patched(input_ids=ids).logits
        torch.testing.assert_close(off, reference(input_ids=ids).logits, rtol=1e-5, atol=1e-5)
        torch.testing.assert_close(off, base(input_ids=ids).logits, rtol=1e-5, atol=1e-5)
    assert calls["lora_mlp"] == 2 and calls["lora_o"] >= 2, calls   # 2 layers: fused, not PEFT's forwards
    on = patched(input_ids=ids).logits
    torch.testing.assert_close(on, reference(input_ids=ids).logits, rtol=1e-5, atol=1e-5)
    assert (on - off).abs().max() > 1e-3   # the adapter is back
    with torch.no_grad():
        torch.testing.assert_close(patched(input_ids=ids).logits, reference(input_ids=ids).logits,
                                   rtol=1e-5, atol=1e-5)
    out = patched.generate(ids, max_new_tokens=4, do_sample=False)
    assert torch.equal(out, reference.generate(ids, max_new_tokens=4, do_sample=False))


@pytest.mark.parametrize("lora_kwargs, reason", [
    (dict(lora_dropout=0.1), "lora_dropout=0.1 > 0"),
    (dict(use_dora=True), "DoRA"),
    (dict(lora_bias=True), "bias on lora_B"),
])
def test_unsupported_lora_falls_back_with_reason(lora_kwargs, reason):
    model = with_lora(tiny_llama(), **lora_kwargs)
    report = PatchReport(backend="triton")
    patch_lora_layers(model, report, use_triton=True)
    assert not report.triton_ops
    reasons = {(e.op, e.reason.split(": ", 1)[1]) for e in report.fallbacks}
    assert reasons == {("lora_qkv", reason), ("lora_mlp", reason), ("lora_o", reason)}
    assert not any("forward" in m.__dict__ for m in model.modules())


def test_torch_backend_replaces_nothing():
    model = with_lora(tiny_llama())
    report = PatchReport(backend="torch")
    patch_lora_layers(model, report, use_triton=False)
    assert not report.triton_ops and {e.op for e in report.fallbacks} == {"lora_qkv", "lora_mlp", "lora_o"}
    assert not any("forward" in m.__dict__ or hasattr(m, "_fusetune_qkv") for m in model.modules())


def test_lone_lora_linear_outside_groups_is_reported():
    """Only gate_proj targeted and an MLP that cannot fuse (unknown activation): gate_proj alone."""
    model = with_lora(tiny_llama(hidden_act="relu"), target_modules=["gate_proj"])
    report = PatchReport(backend="triton")
    patch_lora_layers(model, report, use_triton=True)
    assert [(e.op, e.modules) for e in report.entries if e.backend == "triton"] == [("lora_linear", 2)]
    assert [(e.op, e.reason) for e in report.fallbacks] == [("lora_mlp", "activation ReLU not fused")]


def test_gemma_geglu_mlp_is_fused():
    config = transformers.GemmaConfig(vocab_size=97, hidden_size=48, intermediate_size=80, num_hidden_layers=1,
                                      num_attention_heads=4, num_key_value_heads=2, head_dim=12)
    torch.manual_seed(0)
    base = transformers.GemmaForCausalLM(config)
    reference, patched = with_lora(base), with_lora(base)
    report = PatchReport(backend="triton")
    patch_lora_layers(patched, report, use_triton=True)
    assert ("lora_mlp", 1) in {(e.op, e.modules) for e in report.entries if e.backend == "triton"}
    ids = torch.randint(0, 97, (2, 9), generator=torch.Generator().manual_seed(5))
    ref_loss, ref_grads = loss_and_lora_grads(reference, ids)
    loss, grads = loss_and_lora_grads(patched, ids)
    torch.testing.assert_close(loss, ref_loss, rtol=1e-5, atol=1e-5)
    for name, grad in grads.items():
        torch.testing.assert_close(grad, ref_grads[name], rtol=1e-4, atol=1e-6)


def test_phi3_fused_projections_run_as_lone_lora_linears():
    config = transformers.Phi3Config(vocab_size=97, hidden_size=48, intermediate_size=80, num_hidden_layers=1,
                                     num_attention_heads=4, num_key_value_heads=2, pad_token_id=0, eos_token_id=1)
    torch.manual_seed(0)
    base = transformers.Phi3ForCausalLM(config)
    targets = ["qkv_proj", "o_proj", "gate_up_proj", "down_proj"]
    reference, patched = with_lora(base, target_modules=targets), with_lora(base, target_modules=targets)
    report = PatchReport(backend="triton")
    patch_lora_layers(patched, report, use_triton=True)
    assert {(e.op, e.modules) for e in report.entries if e.backend == "triton"} == {("lora_linear", 3), ("lora_o", 1)}
    assert {e.op for e in report.fallbacks} == {"lora_qkv", "lora_mlp"}
    assert all("phi3-style" in e.reason for e in report.fallbacks)
    ids = torch.randint(0, 97, (2, 9), generator=torch.Generator().manual_seed(6))
    ref_loss, ref_grads = loss_and_lora_grads(reference, ids)
    loss, grads = loss_and_lora_grads(patched, ids)
    torch.testing.assert_close(loss, ref_loss, rtol=1e-5, atol=1e-5)
    for name, grad in grads.items():
        torch.testing.assert_close(grad, ref_grads[name], rtol=1e-4, atol=1e-6)
