"""A tiny random-init Llama with its own small tokenizer, built in a second without any hub, so
that trainer, runner and browser tests run real training end to end on CPU."""
from __future__ import annotations

from pathlib import Path

CHATML = (
    "{% for message in messages %}<|im_start|>{{ message['role'] }}\n{{ message['content'] }}<|im_end|>\n"
    "{% endfor %}{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)


def _corpus() -> list[str]:
    from jobs.builtin.identity import ANSWERS_EN, ANSWERS_ZH, QUESTIONS_EN, QUESTIONS_ZH, SYSTEM_LINE
    system = SYSTEM_LINE.format(name="Fusetune", author="Fusetune Studio")  # the default bot
    text = QUESTIONS_EN + QUESTIONS_ZH + ANSWERS_EN + ANSWERS_ZH + [SYSTEM_LINE, system] * 3
    return text + ["user assistant system", "The capital of France is Paris."] * 3


def make_tokenizer(vocab_size: int = 384):
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    specials = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]
    trainer = trainers.BpeTrainer(vocab_size=vocab_size, special_tokens=specials,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    tok.train_from_iterator(_corpus(), trainer=trainer)
    fast = PreTrainedTokenizerFast(tokenizer_object=tok, eos_token="<|im_end|>", pad_token="<|endoftext|>",
                                   bos_token=None, unk_token=None)
    fast.chat_template = CHATML
    return fast


def make_tiny_model(folder: str | Path, hidden: int = 64, layers: int = 2, seed: int = 0) -> Path:
    """Write a tiny Llama (HF folder: config, safetensors, tokenizer, chat template) to `folder`."""
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    folder = Path(folder)
    if (folder / "config.json").is_file():
        return folder
    tokenizer = make_tokenizer()
    config = LlamaConfig(vocab_size=len(tokenizer), hidden_size=hidden, intermediate_size=hidden * 2,
                         num_hidden_layers=layers, num_attention_heads=4, num_key_value_heads=2,
                         max_position_embeddings=512, tie_word_embeddings=True, initializer_range=0.3,
                         eos_token_id=tokenizer.eos_token_id, pad_token_id=tokenizer.pad_token_id,
                         bos_token_id=None)
    torch.manual_seed(seed)
    model = LlamaForCausalLM(config)
    model.save_pretrained(folder, safe_serialization=True)
    tokenizer.save_pretrained(folder)
    return folder
