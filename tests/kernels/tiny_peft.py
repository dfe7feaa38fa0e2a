"""Tiny random models with LoRA adapters for the kernel tests: one per architecture row, an image-text
model as the job loads it, and a step's loss and gradients to compare patched against transformers."""
import torch
from peft import LoraConfig, get_peft_model
from transformers import AutoConfig, AutoModelForCausalLM

from jobs.models import load
from jobs.spec import JobSpec

TARGETS = ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"]
SMALL = dict(vocab_size=128, hidden_size=64, intermediate_size=96, num_hidden_layers=2,
             num_attention_heads=4, num_key_value_heads=2, head_dim=16, max_position_embeddings=128,
             pad_token_id=0, bos_token_id=1, eos_token_id=2)
EXTRA = {  # exercise each row's peculiarities at tiny size
    "mistral": dict(sliding_window=8),
    "gemma2": dict(sliding_window=8, attn_logit_softcapping=50.0, final_logit_softcapping=30.0),
    "gemma3_text": dict(sliding_window=8),
}


def tiny_model(model_type: str, seed: int = 0, **overrides):
    """A random fp32 model of `model_type` at SMALL's size, with its row's peculiarities (EXTRA)."""
    torch.manual_seed(seed)
    config = AutoConfig.for_model(model_type, **{**SMALL, **EXTRA.get(model_type, {}), **overrides})
    return AutoModelForCausalLM.from_config(config).float()


def with_lora(model, dropout: float = 0.0):
    """PEFT LoRA r=4 on every linear layer, B random too."""
    config = LoraConfig(r=4, lora_alpha=8, lora_dropout=dropout, target_modules="all-linear",
                        init_lora_weights=False)  # random B too, so every LoRA grad is non-zero
    return get_peft_model(model, config)


def batch(seed: int = 1):
    """Two rows of 13 token ids and their labels, the first row's prompt masked."""
    generator = torch.Generator().manual_seed(seed)
    input_ids = torch.randint(3, 128, (2, 13), generator=generator)
    labels = input_ids.clone()
    labels[0, :4] = -100  # a masked prompt
    return input_ids, labels


def loss_and_grads(model):
    """One training step's loss and every parameter gradient on `batch()`."""
    input_ids, labels = batch()
    model.zero_grad(set_to_none=True)
    loss = model(input_ids=input_ids, labels=labels).loss
    loss.backward()
    return loss.detach(), {n: p.grad for n, p in model.named_parameters() if p.grad is not None}


def lora_model(folder, vision_lora: bool = False, dtype=torch.float32):
    """The tiny model at `folder` as a job loads it (jobs.models.load), with LoRA r=4 alpha 8 (on the
    tower too with vision_lora) and a random B, so every LoRA gradient is non-zero."""
    torch.manual_seed(0)
    base = load.load_base_model(str(folder), dtype, torch.device("cpu"))
    model = load.add_lora(base, JobSpec(model=str(folder), lora_r=4, lora_alpha=8, vision_lora=vision_lora))
    with torch.no_grad():
        for name, param in model.named_parameters():
            if "lora_B" in name:
                param.normal_(0, 0.1)
    return model
