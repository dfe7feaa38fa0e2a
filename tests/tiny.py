"""A tiny random-init Llama with its own small tokenizer, built in a second without any hub, so
that trainer, runner and browser tests run real training end to end on CPU."""
from __future__ import annotations

from pathlib import Path

CHATML = (
    "{% for message in messages %}<|im_start|>{{ message['role'] }}\n{{ message['content'] }}<|im_end|>\n"
    "{% endfor %}{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)


CORPUS = Path(__file__).with_name("tiny_corpus.txt")


def _corpus() -> list[str]:
    """The tokenizers' training text, one line each: a fixed file of its own (the identity rows,
    system lines and a few words as they were at issue 42; repeats weigh their merges), so that
    editing the identity dataset does not re-split the tiny tokenizer's words under every test."""
    return CORPUS.read_text(encoding="utf-8").splitlines()


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


MISTRAL_TEMPLATE = (
    "{{ bos_token }}{% for message in messages %}{% if message['role'] == 'user' %}"
    "{{ '[INST] ' + message['content'] + ' [/INST]' }}{% elif message['role'] == 'assistant' %}"
    "{{ message['content'] + eos_token }}{% else %}{{ raise_exception('Only user and assistant roles are "
    "supported!') }}{% endif %}{% endfor %}"
)


def make_spm_tokenizer(vocab_size: int = 420):
    """A Llama-2/Mistral-style tokenizer: BPE over '▁'-joined text with byte fallback (<0x00>..<0xFF>
    at ids 3..258, as SentencePiece lays them out), BOS added, and Mistral's [INST] template."""
    import json

    from tokenizers import Tokenizer, decoders, models, normalizers, processors, trainers
    from transformers import PreTrainedTokenizerFast

    specials = ["<unk>", "<s>", "</s>"]
    normalizer = normalizers.Sequence([normalizers.Prepend("▁"), normalizers.Replace(" ", "▁")])
    draft = Tokenizer(models.BPE(unk_token="<unk>"))
    draft.normalizer = normalizer
    draft.train_from_iterator(_corpus(), trainer=trainers.BpeTrainer(vocab_size=vocab_size, special_tokens=specials))
    trained = json.loads(draft.to_str())["model"]
    vocab = {token: i for i, token in enumerate(specials + [f"<0x{b:02X}>" for b in range(256)])}
    for token, _ in sorted(trained["vocab"].items(), key=lambda item: item[1]):
        vocab.setdefault(token, len(vocab))
    merges = [tuple(m.split(" ")) if isinstance(m, str) else tuple(m) for m in trained["merges"]]
    tok = Tokenizer(models.BPE(vocab=vocab, merges=merges, unk_token="<unk>", byte_fallback=True, fuse_unk=True))
    tok.normalizer = normalizer
    tok.decoder = decoders.Sequence([decoders.Replace("▁", " "), decoders.ByteFallback(), decoders.Fuse(),
                                     decoders.Strip(" ", 1, 0)])
    tok.post_processor = processors.TemplateProcessing(single="<s> $A", pair="<s> $A <s> $B",
                                                       special_tokens=[("<s>", 1)])
    fast = PreTrainedTokenizerFast(tokenizer_object=tok, bos_token="<s>", eos_token="</s>", unk_token="<unk>")
    fast.chat_template = MISTRAL_TEMPLATE
    return fast


def make_qwen2_tokenizer(vocab_size: int = 384):
    """A Qwen2-style byte-level BPE: Qwen2's split regex before ByteLevel, ChatML specials."""
    from tokenizers import Regex, Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast
    from transformers.models.qwen2.tokenization_qwen2 import PRETOKENIZE_REGEX

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.Sequence([
        pre_tokenizers.Split(Regex(PRETOKENIZE_REGEX), behavior="isolated"),
        pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)])
    tok.decoder = decoders.ByteLevel()
    specials = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]
    trainer = trainers.BpeTrainer(vocab_size=vocab_size, special_tokens=specials,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    tok.train_from_iterator(_corpus(), trainer=trainer)
    fast = PreTrainedTokenizerFast(tokenizer_object=tok, eos_token="<|im_end|>", pad_token="<|endoftext|>")
    fast.chat_template = CHATML
    return fast


def make_tiny_family_model(folder: str | Path, family: str, hidden: int = 64, layers: int = 2,
                           seed: int = 0) -> Path:
    """A tiny random mistral (SentencePiece-style tokenizer, untied lm_head) or qwen2 (byte-level
    BPE, q/k/v biases, tied embeddings) HF folder, like make_tiny_model's llama."""
    import torch
    from transformers import MistralConfig, MistralForCausalLM, Qwen2Config, Qwen2ForCausalLM

    folder = Path(folder)
    if (folder / "config.json").is_file():
        return folder
    common = dict(hidden_size=hidden, intermediate_size=hidden * 2, num_hidden_layers=layers,
                  num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=512,
                  initializer_range=0.3)
    if family == "mistral":
        tokenizer = make_spm_tokenizer()
        config = MistralConfig(vocab_size=len(tokenizer), tie_word_embeddings=False, sliding_window=None,
                               bos_token_id=1, eos_token_id=2, pad_token_id=None, **common)
        model_class = MistralForCausalLM
    elif family == "qwen2":
        tokenizer = make_qwen2_tokenizer()
        config = Qwen2Config(vocab_size=len(tokenizer) + 8, tie_word_embeddings=True,  # padded like Qwen's
                             eos_token_id=tokenizer.eos_token_id, pad_token_id=tokenizer.pad_token_id,
                             bos_token_id=None, **common)
        model_class = Qwen2ForCausalLM
    else:
        raise ValueError(f"no tiny builder for {family!r}")
    torch.manual_seed(seed)
    model = model_class(config)
    model.save_pretrained(folder, safe_serialization=True)
    tokenizer.save_pretrained(folder)
    return folder


# Qwen2-VL's chat template, cut to what the tests need: an image part becomes
# <|vision_start|><|image_pad|><|vision_end|> (the processor then repeats <|image_pad|> once per merged patch)
QWEN2_VL_TEMPLATE = (
    "{% for message in messages %}<|im_start|>{{ message['role'] }}\n"
    "{% if message['content'] is string %}{{ message['content'] }}{% else %}{% for part in message['content'] %}"
    "{% if part['type'] == 'image' %}<|vision_start|><|image_pad|><|vision_end|>"
    "{% elif part['type'] == 'text' %}{{ part['text'] }}{% endif %}{% endfor %}{% endif %}<|im_end|>\n"
    "{% endfor %}{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)
VISION_SPECIALS = ["<|vision_start|>", "<|vision_end|>", "<|image_pad|>", "<|video_pad|>"]


def make_tiny_vision_model(folder: str | Path, hidden: int = 64, layers: int = 2, seed: int = 0,
                           family: str = "qwen2_5_vl") -> Path:
    """A tiny random Qwen2.5-VL (or family="qwen2_vl": Qwen2-VL) HF folder: config, safetensors, a
    Qwen2-style tokenizer with the vision specials, and the PIL image processor's
    preprocessor_config.json (no torchvision, no hub)."""
    import torch
    from transformers import (Qwen2_5_VLConfig, Qwen2_5_VLForConditionalGeneration, Qwen2VLConfig,
                              Qwen2VLForConditionalGeneration)
    from transformers.models.qwen2_vl.image_processing_pil_qwen2_vl import Qwen2VLImageProcessorPil

    folder = Path(folder)
    if (folder / "config.json").is_file():
        return folder
    tokenizer = make_qwen2_tokenizer()
    tokenizer.add_special_tokens({"additional_special_tokens": VISION_SPECIALS})
    tokenizer.chat_template = QWEN2_VL_TEMPLATE
    ids = {t: tokenizer.convert_tokens_to_ids(t) for t in VISION_SPECIALS}
    text = dict(vocab_size=len(tokenizer), hidden_size=hidden, intermediate_size=hidden * 2,
                num_hidden_layers=layers, num_attention_heads=4, num_key_value_heads=2,
                max_position_embeddings=2048, initializer_range=0.3,
                bos_token_id=None, eos_token_id=tokenizer.eos_token_id, pad_token_id=tokenizer.pad_token_id,
                # M-RoPE's (temporal, height, width) sections of the rotary half: they sum to head_dim // 2
                rope_parameters={"rope_type": "default", "rope_theta": 10000.0, "mrope_section": [2, 3, 3]})
    vision = dict(depth=2, hidden_size=32, intermediate_size=64, num_heads=2, out_hidden_size=hidden,
                  patch_size=14, spatial_merge_size=2, temporal_patch_size=2, window_size=56,
                  fullatt_block_indexes=[1])
    config_class, model_class = Qwen2_5_VLConfig, Qwen2_5_VLForConditionalGeneration
    if family == "qwen2_vl":   # its vision tower: LayerNorm + GELU MLP blocks, sized by embed_dim
        vision = dict(depth=2, embed_dim=32, hidden_size=hidden, mlp_ratio=2, num_heads=2, patch_size=14,
                      spatial_merge_size=2, temporal_patch_size=2)
        config_class, model_class = Qwen2VLConfig, Qwen2VLForConditionalGeneration
    config = config_class(text_config=text, vision_config=vision, image_token_id=ids["<|image_pad|>"],
                              video_token_id=ids["<|video_pad|>"], vision_start_token_id=ids["<|vision_start|>"],
                              vision_end_token_id=ids["<|vision_end|>"], bos_token_id=None,
                              eos_token_id=tokenizer.eos_token_id, pad_token_id=tokenizer.pad_token_id,
                              tie_word_embeddings=True)
    torch.manual_seed(seed)
    model = model_class(config)
    model.save_pretrained(folder, safe_serialization=True)
    tokenizer.save_pretrained(folder)
    # small images: 28x28 .. 112x112 pixels, i.e. 1 to 16 image tokens each
    Qwen2VLImageProcessorPil(size={"shortest_edge": 28 * 28, "longest_edge": 112 * 112}).save_pretrained(folder)
    return folder
