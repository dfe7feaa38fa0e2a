"""patch_causal_lm_loss: the fused loss equals transformers' ForCausalLMLoss (shifted labels,
-100, num_items_in_batch, Gemma 2 soft-capping), gradients included; without labels the model
behaves exactly as before. patch_label_rows_loss (CPU jobs): the same over the labelled rows only."""
import copy

import pytest
import torch

transformers = pytest.importorskip("transformers")

from kernels.loss_patch import patch_causal_lm_loss, patch_label_rows_loss  # noqa: E402
from kernels.report import PatchReport  # noqa: E402

VOCAB = 211


def tiny(kind="llama", **overrides):
    common = dict(vocab_size=VOCAB, hidden_size=48, intermediate_size=80, num_hidden_layers=2,
                  num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=64)
    torch.manual_seed(0)
    if kind == "gemma2":
        config = transformers.Gemma2Config(**common, head_dim=12, final_logit_softcapping=2.0,
                                           attn_logit_softcapping=None, **overrides)
        return transformers.Gemma2ForCausalLM(config)
    return transformers.LlamaForCausalLM(transformers.LlamaConfig(**common, **overrides))


def patched_twin(model):
    twin = copy.deepcopy(model)
    report = PatchReport(backend="triton")
    patch_causal_lm_loss(twin, report, use_triton=True)
    assert report.triton_ops == ["fused_linear_cross_entropy"], str(report)
    return twin


def batch(seed=1):
    g = torch.Generator().manual_seed(seed)
    ids = torch.randint(0, VOCAB, (3, 11), generator=g)
    labels = ids.clone()
    labels[0, :5] = -100          # a masked prompt
    labels[2, -3:] = -100         # padding
    mask = torch.ones_like(ids)
    mask[2, -3:] = 0
    return ids, labels, mask


def step(model, **inputs):
    model.zero_grad()
    out = model(**inputs)
    out.loss.backward()
    return out, {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None}


def assert_same_step(reference, patched, rtol=1e-5, **inputs):
    ref_out, ref_grads = step(reference, **inputs)
    out, grads = step(patched, **inputs)
    assert out.logits is None and ref_out.logits is not None
    torch.testing.assert_close(out.loss, ref_out.loss, rtol=rtol, atol=rtol)
    assert grads.keys() == ref_grads.keys()
    for name, grad in grads.items():   # every weight trains here, the lm_head included
        err = (grad - ref_grads[name]).abs().max() / ref_grads[name].abs().max()
        assert err < 1e-5, f"{name}: relative error {err:.2e}"


@pytest.mark.parametrize("tied", [False, True])
def test_llama_loss_and_gradients_match(tied):
    model = tiny(tie_word_embeddings=tied)
    ids, labels, mask = batch()
    assert_same_step(model, patched_twin(model), input_ids=ids, attention_mask=mask, labels=labels)


def test_num_items_in_batch_and_positional_arguments():
    model = tiny()
    patched = patched_twin(model)
    ids, labels, mask = batch(2)
    assert_same_step(model, patched, input_ids=ids, labels=labels, num_items_in_batch=torch.tensor(50))
    ref = model(ids, mask, labels=labels).loss
    torch.testing.assert_close(patched(ids, mask, labels=labels).loss, ref, rtol=1e-5, atol=1e-5)


def test_shift_labels_kwarg_is_used_as_given():
    model = tiny()
    patched = patched_twin(model)
    ids, labels, _ = batch(3)
    shifted = torch.roll(labels, -2, dims=1)
    ref = model(input_ids=ids, labels=labels, shift_labels=shifted).loss
    torch.testing.assert_close(patched(input_ids=ids, labels=labels, shift_labels=shifted).loss, ref,
                               rtol=1e-5, atol=1e-5)


def test_gemma2_final_logit_softcapping():
    model = tiny("gemma2")
    with torch.no_grad():   # logits of several units, so the cap of 2.0 changes the loss a lot
        model.model.norm.weight.fill_(200.0)
    ids, labels, mask = batch(4)
    assert_same_step(model, patched_twin(model), input_ids=ids, attention_mask=mask, labels=labels)


def test_without_labels_the_original_forward_runs():
    model = tiny()
    patched = patched_twin(model)
    ids, _, mask = batch(5)
    torch.testing.assert_close(patched(input_ids=ids, attention_mask=mask).logits,
                               model(input_ids=ids, attention_mask=mask).logits)
    assert torch.equal(patched.generate(ids[:1, :4], max_new_tokens=5, do_sample=False),
                       model.generate(ids[:1, :4], max_new_tokens=5, do_sample=False))


def test_peft_wrapped_model_with_lora_on_lm_head_falls_back():
    peft = pytest.importorskip("peft")
    model = peft.get_peft_model(tiny(), peft.LoraConfig(r=4, target_modules=["q_proj", "lm_head"]))
    report = PatchReport(backend="triton")
    patch_causal_lm_loss(model, report, use_triton=True)
    assert not report.triton_ops and "lm_head" in report.fallbacks[0].reason
    assert "forward" not in model.get_base_model().__dict__


def test_peft_wrapped_model_is_patched_and_torch_backend_is_not():
    peft = pytest.importorskip("peft")
    model = peft.get_peft_model(tiny(), peft.LoraConfig(r=4, target_modules=["q_proj"]))
    report = PatchReport(backend="torch")
    patch_causal_lm_loss(model, report, use_triton=False)
    assert report.fallbacks[0].op == "fused_linear_cross_entropy"
    assert "forward" not in model.get_base_model().__dict__
    ids, labels, _ = batch(6)
    reference = model(input_ids=ids, labels=labels).loss
    patch_causal_lm_loss(model, PatchReport(backend="triton"), use_triton=True)
    out = model(input_ids=ids, labels=labels)
    assert out.logits is None
    torch.testing.assert_close(out.loss, reference, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("tied", [False, True])
def test_cpu_label_rows_loss_matches_transformers_and_says_so(tied):
    model = tiny(tie_word_embeddings=tied)
    twin = copy.deepcopy(model)
    assert "label rows only" in patch_label_rows_loss(twin)
    ids, labels, mask = batch(7)
    assert_same_step(model, twin, input_ids=ids, attention_mask=mask, labels=labels)
    assert_same_step(model, twin, input_ids=ids, labels=labels, num_items_in_batch=torch.tensor(50))
    assert patch_label_rows_loss(twin) == "loss: label_rows_cross_entropy"   # bound once
    peft = pytest.importorskip("peft")
    adapted = peft.get_peft_model(tiny(), peft.LoraConfig(r=4, target_modules=["lm_head"]))
    assert "transformers' own" in patch_label_rows_loss(adapted) and "lm_head" in patch_label_rows_loss(adapted)
