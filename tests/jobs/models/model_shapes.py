"""The model shapes and job specs the fit-check tests share: BASELINES' Llama-3.2-1B and 3.1-8B configs (no
weights), an SFT spec, a packed preference spec, and the vision bench's Qwen2.5-VL-7B."""
from transformers import AutoConfig

from jobs.spec import JobSpec

SHAPES = {  # bench/bench_lora.py's shapes (BASELINES.md)
    "llama-3.1-8b": dict(hidden_size=4096, intermediate_size=14336, num_hidden_layers=32, num_attention_heads=32,
                         num_key_value_heads=8, vocab_size=128256, tie_word_embeddings=False),
    "llama-3.2-1b": dict(hidden_size=2048, intermediate_size=8192, num_hidden_layers=16, num_attention_heads=32,
                         num_key_value_heads=8, vocab_size=128256, tie_word_embeddings=True),
}
H200_BYTES = 143_771 * 1024 ** 2
HOST = 512 * 2 ** 30   # the pinned host memory the budget tests assume free


def config(shape):
    """The transformers config of one of SHAPES (no weights)."""
    return AutoConfig.for_model("llama", **SHAPES[shape])


def spec(batch, seq, checkpointing="on", qlora=False, **extra):
    """An SFT job of `batch` rows of `seq` tokens, rank 16, the fused engine."""
    values = {**dict(batch_size=batch, max_seq_length=seq, gradient_checkpointing=checkpointing,
                     load_in_4bit=qlora, fused_kernels=True, lora_r=16, lora_alpha=16), **extra}
    return JobSpec.from_dict(values)


def pref(budget, method="dpo", rows=8, seq=2560, **extra):
    """A packed preference job: `rows` rows of 2 x `seq` tokens a micro-batch (the issue's 1B runs)."""
    values = {**dict(method=method, dataset="builtin:concise", packing="on", batch_size=rows, max_seq_length=seq,
                     gradient_checkpointing="auto", fused_kernels=True, lora_r=16, lora_alpha=16,
                     max_gpu_memory_gb=budget), **extra}
    return JobSpec.from_dict(values)


def seven_b():
    """bench/bench_vision.py's Qwen2.5-VL-7B shape (the vision bench's model)."""
    from transformers import Qwen2_5_VLConfig

    from bench.bench_vision import QWEN25_VL_7B
    return Qwen2_5_VLConfig(text_config=dict(QWEN25_VL_7B["text"], bos_token_id=None),
                            vision_config=QWEN25_VL_7B["vision"])


def vl_spec(**extra):
    """An image-text job of one 4,096-token row, rank 16, bf16, every layer recomputed."""
    values = dict(lora_r=16, lora_alpha=16, batch_size=1, max_seq_length=4096, fused_kernels=True, dtype="bf16",
                  gradient_checkpointing="on")
    return JobSpec.from_dict({**values, **extra})
