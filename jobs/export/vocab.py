"""The tokenizer as GGUF metadata: tokens with their types (and scores), BPE merges, special token
ids, the pre-tokenizer name and the chat template, so llama.cpp and Ollama tokenize and chat as
transformers did in training.

Two tokenizer kinds, as llama.cpp's convert_hf_to_gguf.py writes them:
- byte-level BPE (Llama 3, Qwen2, SmolLM): `tokenizer.ggml.model = gpt2` plus merges
  (TextModel._set_vocab_gpt2 / get_vocab_base);
- SentencePiece-style BPE with byte fallback (Llama 2, Mistral): `llama`, with a score per token.
  Scores are -id: SentencePiece vocabularies are stored best piece first, and llama.cpp merges the
  highest-scoring pair first, so this keeps the merge order.

The pre-tokenizer (how text is split before BPE) is named from the structure of tokenizer.json
(the split regex Llama 3 / Qwen2 / Tekken use, SmolLM's single digits, GPT-2's ByteLevel regex);
llama.cpp identifies it by hashing token ids of a probe text against hub models instead, which
needs those models. A model whose base was itself a GGUF file (the built-in model) keeps the
tokenizer keys of that file verbatim."""
from __future__ import annotations

import json
from pathlib import Path

import gguf

from jobs.messages import say
from jobs.export.files import ExportError

# tokenizer.json split patterns, by llama.cpp pre-tokenizer name (from the models' tokenizer.json)
KNOWN_SPLITS = {
    "llama-bpe": r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*"
                 r"|\s*[\r\n]+|\s+(?!\S)|\s+",
    "qwen2": r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*"
             r"|\s*[\r\n]+|\s+(?!\S)|\s+",
    "tekken": r"[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]*[\p{Ll}\p{Lm}\p{Lo}\p{M}]+|[^\r\n\p{L}\p{N}]?"
              r"[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]+[\p{Ll}\p{Lm}\p{Lo}\p{M}]*|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n/]*"
              r"|\s*[\r\n]+|\s+(?!\S)|\s+",
}
DEFAULT_PRE = "default"


def _steps(node: dict | None) -> list[dict]:
    if not node:
        return []
    return node.get("pretokenizers", []) if node.get("type") == "Sequence" else [node]


def pre_tokenizer_name(tokenizer_json: dict) -> str:
    """llama.cpp's name for this tokenizer's pre-tokenizer, or "default" when not recognised."""
    steps = _steps(tokenizer_json.get("pre_tokenizer"))
    kinds = [step.get("type") for step in steps]
    patterns = [(step.get("pattern") or {}).get("Regex") for step in steps if step.get("type") == "Split"]
    for name, pattern in KNOWN_SPLITS.items():
        if pattern in patterns:
            return name
    if kinds == ["Digits", "ByteLevel"] and steps[0].get("individual_digits") and steps[1].get("use_regex", True):
        return "smollm"
    if kinds == ["ByteLevel"] and steps[0].get("use_regex", True):
        return "gpt-2"
    return DEFAULT_PRE


def tokenizer_kind(tokenizer_json: dict) -> str:
    model = tokenizer_json.get("model") or {}
    decoder = (tokenizer_json.get("decoder") or {}).get("type")
    pre_steps = [step.get("type") for step in _steps(tokenizer_json.get("pre_tokenizer"))]
    byte_level = decoder == "ByteLevel" or "ByteLevel" in pre_steps
    if model.get("type") == "BPE" and model.get("byte_fallback"):
        return "llama"
    if model.get("type") == "BPE" and byte_level:
        return "gpt2"
    raise ExportError(say("export_tokenizer_kind", kind=model.get("type", "unknown")))


def _token_table(tokenizer, vocab_size: int) -> list[tuple[str, gguf.TokenType]]:
    """(text, type) for ids 0..vocab_size-1, the way get_vocab_base classifies them."""
    import re
    reverse = {i: t for t, i in tokenizer.get_vocab().items()}
    added = tokenizer.added_tokens_decoder
    table = []
    for i in range(vocab_size):
        token = reverse.get(i)
        if token is None:
            table.append((f"[PAD{i}]", gguf.TokenType.UNUSED))
        elif i in added:
            special = added[i].special or (token.startswith("<|") and token.endswith("|>"))
            table.append((token, gguf.TokenType.CONTROL if special else gguf.TokenType.USER_DEFINED))
        elif re.fullmatch(r"<0x[0-9A-Fa-f]{2}>", token):
            table.append((token, gguf.TokenType.BYTE))
        else:
            table.append((token, gguf.TokenType.NORMAL))
    return table


def _space_prefix(tokenizer_json: dict) -> bool:
    """SentencePiece-style tokenizers that prepend '▁' to the text (Llama 2, Mistral v0.1-v0.3)."""
    node = tokenizer_json.get("normalizer") or {}
    normalizers = node.get("normalizers", []) if node.get("type") == "Sequence" else [node]
    if any(n.get("type") == "Prepend" for n in normalizers):
        return True
    return any(s.get("type") == "Metaspace" and s.get("prepend_scheme", "always") != "never"
               for s in _steps(tokenizer_json.get("pre_tokenizer")))


def add_tokenizer(writer: gguf.GGUFWriter, tokenizer_dir: Path, vocab_size: int,
                  source_gguf: Path | None = None) -> list[str]:
    """Write the tokenizer keys; returns notes for the user (e.g. an unrecognised pre-tokenizer)."""
    from transformers import AutoTokenizer
    if source_gguf is not None:
        copy_tokenizer_keys(writer, source_gguf)
        _add_chat_template(writer, tokenizer_dir)
        return [f"tokenizer copied from {source_gguf.name}"]
    path = tokenizer_dir / "tokenizer.json"
    if not path.is_file():
        raise ExportError(say("export_no_fast_tokenizer", name=path.name, folder=tokenizer_dir))
    tokenizer_json = json.loads(path.read_text(encoding="utf-8"))
    kind = tokenizer_kind(tokenizer_json)
    tokenizer = AutoTokenizer.from_pretrained(tokenizer_dir)
    if len(tokenizer) > vocab_size:
        raise ExportError(say("export_vocab_too_big", count=len(tokenizer), size=vocab_size))
    table = _token_table(tokenizer, vocab_size)
    writer.add_tokenizer_model(kind)
    writer.add_token_list([text for text, _ in table])
    writer.add_token_types([int(kind_) for _, kind_ in table])
    notes = []
    if kind == "gpt2":
        pre = pre_tokenizer_name(tokenizer_json)
        if pre == DEFAULT_PRE:
            notes.append(say("export_note_pre_tokenizer"))
        writer.add_tokenizer_pre(pre)
    else:
        writer.add_tokenizer_pre(DEFAULT_PRE)
        writer.add_token_scores([-float(i) if t == gguf.TokenType.NORMAL else 0.0 for i, (_, t) in enumerate(table)])
        writer.add_add_space_prefix(_space_prefix(tokenizer_json))
    special = gguf.SpecialVocab(tokenizer_dir, load_merges=kind == "gpt2", n_vocab=vocab_size)
    special.add_to_gguf(writer, quiet=True)
    return notes


def _add_chat_template(writer: gguf.GGUFWriter, tokenizer_dir: Path) -> None:
    template = gguf.SpecialVocab(tokenizer_dir, load_merges=False).chat_template
    if template:
        writer.add_chat_template(template)


def copy_tokenizer_keys(writer: gguf.GGUFWriter, source: Path) -> None:
    """Every tokenizer.ggml.* key of another GGUF file, types preserved."""
    reader = gguf.GGUFReader(str(source))
    for key, field in reader.fields.items():
        if not key.startswith("tokenizer.ggml."):
            continue
        main = field.types[0]
        sub = field.types[1] if main == gguf.GGUFValueType.ARRAY and len(field.types) > 1 else None
        writer.add_key_value(key, field.contents(), main, sub_type=sub)
