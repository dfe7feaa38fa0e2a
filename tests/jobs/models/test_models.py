"""jobs/models/load.py: a QLoRA model loaded for training on the CPU keeps one numeric path."""
from types import SimpleNamespace

import pytest
import torch

pytest.importorskip("bitsandbytes")


def test_a_cpu_qlora_model_trains_through_its_4bit_layers_after_an_eval_pass(tiny_model, monkeypatch):
    """bitsandbytes repacks 4-bit weights for a bf16 kernel at the first eval forward on
    AVX512-BF16 CPUs, after which no gradient flows through them; pretend this CPU has it."""
    import bitsandbytes.nn.modules as bnb_modules

    from jobs.models.load import add_lora, load_base_model
    monkeypatch.setattr(bnb_modules, "has_avx512bf16", lambda: True)
    model = load_base_model(str(tiny_model), torch.float32, torch.device("cpu"), load_in_4bit=True)
    linears = [m for m in model.modules() if isinstance(m, bnb_modules.Linear4bit)]
    assert linears and not any(m.support_avx512bf16_for_cpu for m in linears)
    lora = SimpleNamespace(lora_r=4, lora_alpha=8, lora_dropout=0.0, target_modules=["q_proj", "v_proj", "down_proj"])
    model = add_lora(model, lora)
    ids = torch.randint(0, model.config.vocab_size, (2, 12))

    def first_layer_grads():
        model.train()
        model.zero_grad(set_to_none=True)
        model(input_ids=ids, labels=ids).loss.backward()
        return {n: p.grad.clone() for n, p in model.named_parameters() if p.requires_grad and ".layers.0." in n}

    before = first_layer_grads()
    model.eval()
    with torch.no_grad():
        model(input_ids=ids)
    after = first_layer_grads()
    assert before and all(g.abs().sum() > 0 for n, g in after.items() if "lora_B" in n)   # A's are 0: B starts at 0
    for name in before:
        torch.testing.assert_close(after[name], before[name], rtol=1e-5, atol=1e-7)
