import pytest
import torch


@pytest.fixture(scope="module")
def policy(tiny_model):
    """The tiny Llama with a LoRA adapter that changes its output (fp32, eval mode), and its tokenizer: GRPO's
    decode and packed-pass tests compare against it."""
    from peft import LoraConfig, get_peft_model
    from transformers import AutoModelForCausalLM, AutoTokenizer

    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_pretrained(tiny_model, torch_dtype=torch.float32)
    peft = get_peft_model(model, LoraConfig(r=4, lora_alpha=8, target_modules=["q_proj", "v_proj", "up_proj"]))
    with torch.no_grad():   # a LoRA that changes the output, so "LoRA on" is what is compared
        for name, param in peft.named_parameters():
            if "lora_B" in name:
                param.normal_(0, 0.5)
    return peft.eval(), AutoTokenizer.from_pretrained(tiny_model)
