"""What an exported model computes, next to what the job's base + adapter computes: logits on fixed token ids
from a merged folder, a GGUF file, the merged weights rounded as a GGUF stores them, and base + PEFT adapter
(shared by the merged, GGUF and per-method export tests)."""
import gguf
import torch

IDS = torch.tensor([[1, 5, 9, 14, 20, 33, 41, 7]])
GGUF_IDS = torch.tensor([[1, 5, 9, 14, 20, 33, 41, 7, 100, 3]])


def peft_logits(base_dir, adapter_dir, **load):
    from peft import PeftModel
    from transformers import AutoModelForCausalLM

    from jobs.models.load import keep_cpu_4bit_trainable
    with torch.no_grad():
        base = AutoModelForCausalLM.from_pretrained(base_dir, **load)
        keep_cpu_4bit_trainable(base)   # a 4-bit base computes as the job did (no bf16 CPU repack)
        model = PeftModel.from_pretrained(base, adapter_dir)
        return model(IDS).logits.float()


def folder_logits(folder):
    from transformers import AutoModelForCausalLM
    with torch.no_grad():
        return AutoModelForCausalLM.from_pretrained(folder)(IDS).logits.float()


def logits(model) -> torch.Tensor:
    with torch.no_grad():
        return model(GGUF_IDS).logits.float()


def load_gguf(path):
    from transformers import AutoModelForCausalLM
    return AutoModelForCausalLM.from_pretrained(path.parent, gguf_file=path.name, dtype=torch.float32)


def stored_as(folder, quant):
    """The merged model with each matrix rounded the way the GGUF stores it."""
    from transformers import AutoModelForCausalLM
    model = AutoModelForCausalLM.from_pretrained(folder, dtype=torch.float32)
    qtype = {"f16": gguf.GGMLQuantizationType.F16, "bf16": gguf.GGMLQuantizationType.BF16,
             "q8_0": gguf.GGMLQuantizationType.Q8_0}[quant]
    with torch.no_grad():
        for name, param in model.named_parameters():
            if param.dim() == 2:
                data = param.numpy()
                param.copy_(torch.from_numpy(gguf.quants.dequantize(gguf.quants.quantize(data, qtype), qtype)))
    return model
