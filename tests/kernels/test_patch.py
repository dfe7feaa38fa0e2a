"""patch_model on a tiny random model of every architecture in the table, plain and PEFT LoRA:
the Triton-patched model (CPU interpreter) must give the same loss and gradients as transformers."""
import copy

import pytest
import torch
from transformers import AutoConfig, AutoModelForCausalLM

import kernels.patch as patch_module
from kernels import PatchReport, patch_model
from kernels.arch import ARCHITECTURES
from tests.kernels.tiny_peft import batch, loss_and_grads, tiny_model, with_lora

# decoder norms per layer (+1 final norm); q_norm/k_norm count as norms too
NORMS_PER_LAYER = {"qwen3": 4, "gemma2": 4, "gemma3_text": 6}
LOSS_TOL = dict(atol=1e-5, rtol=1e-5)
GRAD_TOL = dict(atol=2e-5, rtol=1e-3)  # fp32 end to end; kernels reorder fp32 sums


def assert_same_training_step(patched, reference):
    loss, grads = loss_and_grads(patched)
    loss_ref, grads_ref = loss_and_grads(reference)
    torch.testing.assert_close(loss, loss_ref, **LOSS_TOL)
    assert grads.keys() == grads_ref.keys() and grads
    for name, grad in grads.items():
        torch.testing.assert_close(grad, grads_ref[name], **GRAD_TOL, msg=lambda m: f"{name}: {m}")


@pytest.fixture
def op_calls(monkeypatch):
    """Counts calls of the ops the patched forwards use, proving the kernels actually ran."""
    calls = {"rms_norm": 0, "rope": 0}
    for name in calls:
        real = getattr(patch_module, name)

        def counting(*args, _real=real, _name=name, **kwargs):
            calls[_name] += 1
            return _real(*args, **kwargs)

        monkeypatch.setattr(patch_module, name, counting)
    return calls


def entry(report: PatchReport, op: str):
    found = [e for e in report.entries if e.op == op]
    assert len(found) == 1, f"expected one {op} entry in:\n{report}"
    return found[0]


@pytest.mark.parametrize("model_type", sorted(ARCHITECTURES))
def test_patched_lora_model_matches_transformers(model_type, op_calls):
    reference = with_lora(tiny_model(model_type))
    patched = copy.deepcopy(reference)
    report = patch_model(patched, backend="triton")
    n_layers, n_norms = 2, 2 * NORMS_PER_LAYER.get(model_type, 2) + 1
    assert report.backend == "triton" and report.architecture == model_type
    assert entry(report, "rms_norm").modules == n_norms
    assert entry(report, "rope").modules == n_layers
    activation = "swiglu" if ARCHITECTURES[model_type].act_config_key == "hidden_act" \
        and not model_type.startswith("gemma") else "geglu"
    assert entry(report, activation).modules == n_layers and entry(report, activation).backend == "triton"
    assert_same_training_step(patched, reference)
    assert op_calls == {"rms_norm": n_norms, "rope": n_layers}


@pytest.mark.parametrize("model_type", ["llama", "gemma", "phi3"])
def test_patched_plain_model_matches_transformers(model_type):
    """No LoRA: every weight trains, so rms_norm's dW path and our own MLP activation run."""
    reference = tiny_model(model_type, seed=3)
    patched = copy.deepcopy(reference)
    report = patch_model(patched, backend="triton")
    assert not [e for e in report.fallbacks if e.op in ("rms_norm", "rope", "swiglu", "geglu")]
    assert_same_training_step(patched, reference)


def test_phi3_partial_rotary_is_fused():
    reference = with_lora(tiny_model("phi3", partial_rotary_factor=0.5))
    assert reference.get_base_model().model.rotary_emb.inv_freq.numel() == 4  # 8 of 16 dims rotate
    patched = copy.deepcopy(reference)
    assert entry(patch_model(patched, backend="triton"), "rope").backend == "triton"
    assert_same_training_step(patched, reference)


def test_lora_dropout_falls_back_with_reason():
    model = with_lora(tiny_model("llama"), dropout=0.1)
    report = patch_model(model, backend="triton")
    lora = [e for e in report.fallbacks if e.op.startswith("lora")]
    assert lora and all("lora_dropout=0.1" in e.reason for e in lora), str(report)
    assert entry(report, "rms_norm").backend == "triton"  # the rest still fuses


def test_unknown_architecture_stays_on_torch():
    torch.manual_seed(0)
    config = AutoConfig.for_model("gpt2", vocab_size=128, n_embd=64, n_layer=2, n_head=4, n_positions=64)
    model = with_lora(AutoModelForCausalLM.from_config(config))
    report = patch_model(model, backend="triton")
    assert report.architecture is None and not report.triton_ops
    assert report.fallbacks and all("unknown architecture 'gpt2'" in e.reason for e in report.fallbacks)
    assert not any("forward" in m.__dict__ for m in model.modules())


def test_auto_on_cpu_resolves_to_torch_and_changes_nothing():
    model = tiny_model("llama")
    report = patch_model(model, backend="auto")
    assert report.backend == "torch" and not report.triton_ops
    assert all("no CUDA device" in e.reason for e in report.fallbacks if e.op in ("rms_norm", "rope"))
    assert not any("forward" in m.__dict__ for m in model.modules())


def test_patching_twice_does_not_stack_and_torch_undoes(op_calls):
    model = tiny_model("qwen3")
    first = patch_model(model, backend="triton")
    second = patch_model(model, backend="triton")
    assert [(e.op, e.modules, e.backend) for e in first.entries] == \
        [(e.op, e.modules, e.backend) for e in second.entries]
    for module in model.modules():
        original = getattr(module, "_fusetune_original_forward", None)
        if original is not None:  # wraps the class forward, never an earlier patch
            assert original.__func__ is type(module).forward
    loss_and_grads(model)
    assert op_calls == {"rms_norm": 9, "rope": 2}
    patch_model(model, backend="torch")
    assert not any("forward" in m.__dict__ for m in model.modules())


def test_unknown_backend_is_refused():
    with pytest.raises(ValueError, match="backend must be one of"):
        patch_model(tiny_model("llama"), backend="cuda")


def test_generation_with_kv_cache_matches_transformers():
    """The patched attention also serves cached decoding (the cache argument's name and
    `update` call differ between transformers 5.17 and 5.24)."""
    reference = tiny_model("qwen3", seed=5).eval()
    patched = copy.deepcopy(reference)
    patch_model(patched, backend="triton")
    input_ids, _ = batch()
    kwargs = dict(max_new_tokens=4, do_sample=False, pad_token_id=0)
    assert torch.equal(patched.generate(input_ids, **kwargs), reference.generate(input_ids, **kwargs))


def test_activation_without_gated_kernel_falls_back():
    model = tiny_model("llama", hidden_act="relu")
    report = patch_model(model, backend="triton")
    fallback = entry(report, "mlp_activation[relu]")
    assert fallback.backend == "torch" and fallback.modules == 2 and "no fused gated kernel" in fallback.reason
    assert entry(report, "rms_norm").backend == "triton"
    assert not any("forward" in m.__dict__ for m in model.modules() if type(m).__name__ == "LlamaMLP")


def test_triton_on_cpu_without_interpreter_falls_back(monkeypatch):
    monkeypatch.delenv("TRITON_INTERPRET", raising=False)
    report = patch_model(tiny_model("gemma"), backend="triton")
    assert report.backend == "torch" and not report.triton_ops
    assert "TRITON_INTERPRET=1" in entry(report, "rope").reason
