"""apply_checkpointing: every policy gives the gradients of no checkpointing (CPU), and "auto"
spends memory the way its docstring says."""
import copy

import pytest
import torch
from transformers import LlamaConfig

from kernels import PatchReport, apply_checkpointing
from kernels.checkpoint import GIB, _set_policy, decoder_layers, layer_activation_bytes, plan_auto
from tests.kernels.tiny_peft import lora_model, loss_and_grads, tiny_model, with_lora

EXACT = dict(atol=1e-6, rtol=1e-6)  # same ops in the same order: only recompute differs


def _lora_model():
    # dropout > 0 so that recomputation must replay the same dropout masks (RNG state restored)
    model = with_lora(tiny_model("llama", num_hidden_layers=3), dropout=0.2)
    model.train()
    return model


def _step(model, seed=7):
    torch.manual_seed(seed)  # same dropout masks in both models' first forward
    return loss_and_grads(model)


def _assert_same(model_a, model_b):
    loss_a, grads_a = _step(model_a)
    loss_b, grads_b = _step(model_b)
    torch.testing.assert_close(loss_a, loss_b, **EXACT)
    assert grads_a.keys() == grads_b.keys() and len(grads_a) > 0
    for name in grads_a:
        torch.testing.assert_close(grads_a[name], grads_b[name], **EXACT, msg=lambda m: f"{name}: {m}")


def test_on_matches_off():
    reference = _lora_model()
    model = copy.deepcopy(reference)
    description = apply_checkpointing(model, "on")
    assert "3 layers recomputed" in description
    assert all(layer.gradient_checkpointing for layer in decoder_layers(model))
    apply_checkpointing(reference, "off")
    _assert_same(model, reference)


def test_offload_on_cpu_falls_back_to_plain_checkpointing():
    reference = _lora_model()
    model = copy.deepcopy(reference)
    report = PatchReport(backend="torch")
    description = apply_checkpointing(model, "offload", report=report)
    assert "offload fell back" in description and "needs CUDA" in description
    (fallback,) = [e for e in report.fallbacks if e.op == "checkpoint_offload"]
    assert fallback.modules == 3 and "plain checkpointing" in fallback.reason
    _assert_same(model, reference)


def test_offloaded_checkpoint_function_matches_off(monkeypatch):
    """The offload autograd Function itself (host copies are plain clones on CPU)."""
    import kernels.checkpoint as checkpoint_module

    loads = []
    real_load = checkpoint_module._HostOffloader.load
    monkeypatch.setattr(checkpoint_module._HostOffloader, "load",
                        lambda self, saved: loads.append(saved["index"]) or real_load(self, saved))
    reference = _lora_model()
    model = copy.deepcopy(reference)
    _set_policy(decoder_layers(model), [True, True, True], offload=True, device=torch.device("cpu"))
    _assert_same(model, reference)
    assert loads == [2, 1, 0]  # every layer's input came back, last layer first


def test_checkpointing_a_triton_patched_model_matches_off():
    """Recompute re-runs the in-place Triton ops (rope, swiglu, rms_norm): still exact."""
    from kernels import patch_model

    reference = _lora_model()
    model = copy.deepcopy(reference)
    assert "rope" in patch_model(model, backend="triton").triton_ops
    apply_checkpointing(model, "on")
    _assert_same(model, reference)


def test_partial_policy_checkpoints_the_first_layers_only():
    reference = _lora_model()
    model = copy.deepcopy(reference)
    _set_policy(decoder_layers(model), [True, False, False], offload=False, device=torch.device("cpu"))
    assert [layer.gradient_checkpointing for layer in decoder_layers(model)] == [True, False, False]
    _assert_same(model, reference)


def test_auto_keeps_everything_for_a_tiny_cpu_model():
    model = _lora_model()
    description = apply_checkpointing(model, "auto", batch_tokens=26)
    assert description.startswith("auto: no recompute")
    assert not any(layer.gradient_checkpointing for layer in decoder_layers(model))


LLAMA_8B = LlamaConfig(hidden_size=4096, intermediate_size=14336, num_hidden_layers=32,
                       num_attention_heads=32, num_key_value_heads=8)


def test_auto_on_h200_with_8b_model_chooses_no_recompute():
    per_layer = layer_activation_bytes(LLAMA_8B, 2 * 2048, dtype_bytes=2)
    assert 0.4 * GIB < per_layer < 0.8 * GIB  # ~0.53 GiB: (6h + 2kv + 3I) x 4096 tokens x 2 bytes
    h200_free = int(140 * GIB - 16 * GIB - 0.10 * 140 * GIB - 2 * GIB)  # after bf16 weights, reserve
    flags, offload, description = plan_auto(32, LLAMA_8B, 2, 2 * 2048, h200_free, "cuda")
    assert flags == [False] * 32 and not offload and "no recompute" in description


def test_auto_recomputes_only_what_does_not_fit():
    per_layer = layer_activation_bytes(LLAMA_8B, 4096, 2)
    budget = 20 * per_layer
    flags, offload, description = plan_auto(32, LLAMA_8B, 2, 4096, budget, "cuda")
    keep = flags.count(False)
    assert not offload and 0 < keep < 20 and flags == [True] * (32 - keep) + [False] * keep
    input_bytes = 4096 * 4096 * 2
    assert keep * per_layer + (32 - keep) * input_bytes + per_layer <= budget  # the peak fits
    assert f"{32 - keep} of 32 layers recomputed" in description


def test_auto_offloads_when_even_checkpointing_does_not_fit():
    per_layer = layer_activation_bytes(LLAMA_8B, 4096, 2)
    flags, offload, description = plan_auto(32, LLAMA_8B, 2, 4096, int(1.5 * per_layer), "cuda")
    assert offload and all(flags) and "offloaded to pinned CPU memory" in description
    flags_cpu, offload_cpu, _ = plan_auto(32, LLAMA_8B, 2, 4096, int(1.5 * per_layer), "cpu")
    assert not offload_cpu and all(flags_cpu)


def test_auto_offloads_the_checkpointed_inputs_when_that_keeps_more_layers():
    per_layer = int(1.25 * layer_activation_bytes(LLAMA_8B, 4096, 2))  # plan_auto's margin
    input_bytes = 4096 * 4096 * 2
    budget = 20 * per_layer
    _, _, on_gpu = plan_auto(32, LLAMA_8B, 2, 4096, budget, "cuda")
    flags, offload, description = plan_auto(32, LLAMA_8B, 2, 4096, budget, "cuda", host_bytes=64 * GIB)
    keep = flags.count(False)
    assert offload and keep == 19 and flags == [True] * 13 + [False] * 19
    assert keep * per_layer + per_layer <= budget < (keep + 1) * per_layer + per_layer  # GPU peak fits
    assert "13 of 32 layers offloaded to pinned CPU memory" in description
    assert int(on_gpu.split(" of ")[0].split()[-1]) > 13  # without offload more layers recompute
    # not enough pinnable host memory for the 13 inputs, or no CUDA: the on-GPU plan as before
    tight = plan_auto(32, LLAMA_8B, 2, 4096, budget, "cuda", host_bytes=13 * input_bytes - 1)
    assert not tight[1] and tight[2] == on_gpu
    assert not plan_auto(32, LLAMA_8B, 2, 4096, budget, "cpu", host_bytes=64 * GIB)[1]


def test_unknown_mode_is_refused():
    with pytest.raises(ValueError, match="mode must be one of"):
        apply_checkpointing(_lora_model(), "sometimes")


@pytest.mark.parametrize("vision_lora", [False, True])
def test_a_frozen_vision_towers_blocks_are_left_alone(tmp_path, vision_lora):
    """A frozen tower's blocks run before every LoRA'd layer and keep nothing for backward: "on" and
    "offload" recompute (and offload) only the decoder's layers, and say so; a LoRA'd tower's blocks
    are checkpointed like the decoder's."""
    from tests.tiny import make_tiny_vision_model
    model = lora_model(make_tiny_vision_model(tmp_path / "model", layers=3), vision_lora)
    layers = decoder_layers(model)
    assert len(layers) == 2 + 3   # the tower's two blocks first, then the decoder's three layers
    for mode in ("on", "offload"):
        description = apply_checkpointing(model, mode)
        flags = [layer.gradient_checkpointing for layer in layers]
        if vision_lora:
            assert flags == [True] * 5 and "frozen leading" not in description
        else:
            assert flags == [False, False, True, True, True], mode
            assert description.startswith("checkpointing on: 3 layers recomputed")
            assert "2 frozen leading layers" in description


def _down_needed_and_pair(monkeypatch, model_type: str, layers: int) -> tuple[list, object, object]:
    """Every fused MLP call's `output_needed` as it happens, and two equal LoRA models of `model_type`,
    Triton-patched (no dropout: the MLP is fused), the first to be checkpointed."""
    import kernels.lora_patch as lora_patch
    from kernels import patch_model

    needed = []
    real = lora_patch.lora_mlp
    monkeypatch.setattr(lora_patch, "lora_mlp", lambda *a, **k: needed.append(k["output_needed"]) or real(*a, **k))
    reference = with_lora(tiny_model(model_type, num_hidden_layers=layers))
    reference.train()
    model = copy.deepcopy(reference)
    for each in (model, reference):
        assert "lora_mlp" in patch_model(each, backend="triton").triton_ops
    return needed, model, reference


@pytest.mark.parametrize("offload", [False, True])
def test_recompute_skips_the_mlp_down_projection_and_changes_no_gradient(monkeypatch, offload):
    """A recomputed layer's output is thrown away, so the fused MLP skips its down projection there
    (Llama: the MLP's output only joins the residual); the gradients stay those of no checkpointing."""
    needed, model, reference = _down_needed_and_pair(monkeypatch, "llama", 3)
    _set_policy(decoder_layers(model), [True, True, False], offload=offload, device=torch.device("cpu"))
    _assert_same(model, reference)
    # the model's 3 forwards and 2 recomputes (the third layer kept), then the reference's 3 forwards
    assert needed == [True] * 3 + [False] * 2 + [True] * 3


def test_a_post_norm_mlp_computes_its_output_in_recompute(monkeypatch):
    """Gemma2 normalises the MLP's output before the residual (its backward reads it): no skip."""
    needed, model, reference = _down_needed_and_pair(monkeypatch, "gemma2", 2)
    apply_checkpointing(model, "on")
    _assert_same(model, reference)
    assert needed and all(needed)


def test_a_layer_call_is_cut_to_its_leading_rows_or_says_why_not():
    """kernels/checkpoint_rows.py: the packed-attention arguments come from BackwardRows, per-token ones
    ([T], [B, T, ...]) are sliced, the rest pass; an argument it cannot cut (an attention mask, a per-token
    tensor of another layout) is a named refusal, on which the layer keeps its own checkpoint."""
    import functools
    import re

    from kernels.checkpoint_rows import BackwardRows, cut_layer_call

    def forward(hidden, **kwargs):
        return kwargs
    rows = BackwardRows(tokens=5, documents=2, keys=7, longest_query=3, longest_keys=4, labels=2)
    hidden = torch.zeros(1, 9, 4)
    cos = torch.arange(9.0).view(1, 9, 1).expand(1, 9, 6)
    call = functools.partial(forward, position_ids=torch.arange(9)[None], position_embeddings=(cos, cos),
                             cu_seq_lens_q=torch.tensor([0, 2, 5, 9]), cu_seq_lens_k=torch.tensor([0, 2, 7, 13]),
                             kv_index=torch.arange(13), max_length_q=4, max_length_k=6, use_cache=False,
                             attention_mask=None)
    got = cut_layer_call(call, hidden, rows)(hidden)
    assert got["position_ids"].tolist() == [[0, 1, 2, 3, 4]] and got["position_embeddings"][0].shape == (1, 5, 6)
    assert got["cu_seq_lens_q"].tolist() == [0, 2, 5] and got["cu_seq_lens_k"].tolist() == [0, 2, 7]
    assert got["kv_index"].tolist() == list(range(7)) and (got["max_length_q"], got["max_length_k"]) == (3, 4)
    assert got["use_cache"] is False and got["attention_mask"] is None
    for name, value, why in (("attention_mask", torch.ones(1, 1, 9, 9), "an attention mask"),
                             ("bias", torch.zeros(2, 9, 9), "a per-token argument of shape (2, 9, 9) (bias)")):
        with pytest.raises(ValueError, match=f"^{re.escape(why)}$"):
            cut_layer_call(functools.partial(call, **{name: value}), hidden, rows)
    with pytest.raises(ValueError, match="not one packed row"):
        cut_layer_call(call, torch.zeros(2, 9, 4), rows)
    within = BackwardRows(tokens=7, documents=3, keys=11, longest_query=3, longest_keys=5, labels=2)
    got = cut_layer_call(call, hidden, within)(hidden)   # the cut ends 2 tokens into the third document
    assert got["cu_seq_lens_q"].tolist() == [0, 2, 5, 7] and got["cu_seq_lens_k"].tolist() == [0, 2, 7, 11]
    assert call.keywords["cu_seq_lens_q"].tolist() == [0, 2, 5, 9]   # cut from a copy
