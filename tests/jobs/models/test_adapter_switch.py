"""jobs/models/adapter_switch.py: the base model under a LoRA model, as PEFT's disable_adapter() gives it,
without PEFT's model-wide status report (what made it slow in host-bound reference passes)."""
import pytest
import torch
from peft import LoraConfig, PeftModel, get_peft_model
from transformers import LlamaConfig, LlamaForCausalLM

from jobs.models.adapter_switch import base_model_only, reference_pass

ALL = ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"]


def _lora_model(targets=ALL):
    torch.manual_seed(0)
    config = LlamaConfig(hidden_size=48, intermediate_size=80, num_hidden_layers=2, num_attention_heads=4,
                         num_key_value_heads=2, vocab_size=97)
    peft = get_peft_model(LlamaForCausalLM(config), LoraConfig(r=4, target_modules=targets, init_lora_weights=False))
    return peft.eval()


def _logits(model, ids):
    with torch.no_grad():
        return model(input_ids=ids).logits


def test_matches_peft_disable_adapter_and_restores_the_adapter(monkeypatch):
    peft, ids = _lora_model(), torch.randint(0, 97, (2, 11))
    tuned = _logits(peft, ids)
    with peft.disable_adapter():
        base = _logits(peft, ids)
    assert not torch.allclose(tuned, base)   # the adapter changes the answer
    trainable = {n for n, p in peft.named_parameters() if p.requires_grad}

    def no_report(*_a, **_k):
        raise AssertionError("the model-wide status report is what made PEFT's switch slow")
    monkeypatch.setattr(PeftModel, "get_model_status", no_report)
    with base_model_only(peft):
        torch.testing.assert_close(_logits(peft, ids), base, rtol=0, atol=0)
        assert not any(p.requires_grad for n, p in peft.named_parameters() if "lora_" in n)
    torch.testing.assert_close(_logits(peft, ids), tuned, rtol=0, atol=0)
    assert {n for n, p in peft.named_parameters() if p.requires_grad} == trainable


def test_a_layer_switched_off_before_stays_off():
    peft = _lora_model()
    layer = peft.base_model.model.model.layers[0].self_attn.q_proj
    layer.enable_adapters(False)
    with base_model_only(peft):
        assert layer.disable_adapters
    assert layer.disable_adapters   # PEFT's own context would switch it back on
    assert not peft.base_model.model.model.layers[1].self_attn.q_proj.disable_adapters


def test_an_adapter_added_later_on_other_layers_is_switched_too():
    peft, ids = _lora_model(["q_proj"]), torch.randint(0, 97, (1, 9))
    with base_model_only(peft):   # finds (and remembers) the q_proj layers
        base = _logits(peft, ids)
    peft.add_adapter("second", LoraConfig(r=4, target_modules=["down_proj"], init_lora_weights=False))
    peft.set_adapter("second")
    assert not torch.allclose(_logits(peft, ids), base)
    with base_model_only(peft):
        torch.testing.assert_close(_logits(peft, ids), base, rtol=0, atol=0)


def test_a_model_without_adapters_runs_as_it_is():
    model = torch.nn.Linear(3, 2)
    with base_model_only(model):
        assert model(torch.ones(1, 3)).shape == (1, 2)


def test_the_adapter_comes_back_when_the_pass_fails():
    peft = _lora_model()
    with pytest.raises(RuntimeError):
        with base_model_only(peft):
            raise RuntimeError("a pass that runs out of memory")
    assert not any(m.disable_adapters for m in peft.modules() if hasattr(m, "lora_A"))


def test_a_reference_pass_checkpoints_nothing_and_restores_training_mode():
    """Decoder layers checkpoint only in training mode; a reference pass has no backward, so it must
    not hand its layers to the checkpoint function (ours copies each input to host memory)."""
    peft, ids, calls = _lora_model().train(), torch.randint(0, 97, (1, 9)), []
    for layer in peft.base_model.model.model.layers:
        layer.gradient_checkpointing = True
        layer._gradient_checkpointing_func = lambda run, *args, **kw: calls.append(1) or run(*args, **kw)
    peft(input_ids=ids)
    assert calls, "the training forward checkpoints"
    calls.clear()
    with reference_pass(peft):
        assert not torch.is_grad_enabled() and peft.base_model.model.model.layers[0].self_attn.q_proj.disable_adapters
        assert not any(m.training for m in peft.modules())
        peft(input_ids=ids)
    assert not calls and not peft.base_model.model.model.layers[0].self_attn.q_proj.disable_adapters
    assert all(m.training for m in peft.modules())
