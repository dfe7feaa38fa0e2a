"""Chat templates measured into per-role wrappers and written as an Ollama Go template: ChatML,
SmolLM2's default system prompt, Llama 3 headers, Mistral's [INST] without system turns, and a
template that cannot be expressed that way (no TEMPLATE then)."""
import pytest

from jobs.export import ollama
from tests.jobs.export.templates import LLAMA3, SMOLLM2, with_template
from tests.tiny import CHATML, MISTRAL_TEMPLATE

NUMBERED = "{% for m in messages %}Turn {{ loop.index }} {{ m['role'] }}: {{ m['content'] }}\n{% endfor %}"


def test_chatml_becomes_a_go_template_over_messages(base_tokenizer):
    fmt = ollama.chat_format_of(with_template(base_tokenizer, CHATML))
    assert fmt.system == ("<|im_start|>system\n", "<|im_end|>\n") and fmt.default_system is None
    assert fmt.generation == "<|im_start|>assistant\n"
    assert ollama.go_template(fmt) == (
        '{{ $system := "" }}{{ range $i, $_ := .Messages }}{{ $last := eq (len (slice $.Messages $i)) 1 }}'
        '{{ if eq .Role "system" }}<|im_start|>system\n{{ .Content }}<|im_end|>\n'
        '{{ if $last }}<|im_start|>assistant\n{{ end }}'
        '{{ else if eq .Role "user" }}<|im_start|>user\n{{ .Content }}<|im_end|>\n'
        '{{ if $last }}<|im_start|>assistant\n{{ end }}'
        '{{ else if eq .Role "assistant" }}<|im_start|>assistant\n{{ .Content }}'
        '{{ if not $last }}<|im_end|>\n{{ end }}{{ end }}{{ end }}')
    assert ollama.stop_words(fmt, "<|im_end|>") == ["<|im_end|>", "<|im_start|>"]


def test_a_default_system_prompt_is_kept_and_replaced_by_a_system_turn(base_tokenizer):
    tokenizer = with_template(base_tokenizer, SMOLLM2)
    fmt = ollama.chat_format_of(tokenizer)
    assert fmt.default_system == "You are a helpful AI assistant named SmolLM, trained by Hugging Face"
    chat = [{"role": "user", "content": "Hi"}]
    assert fmt.render(chat, True) == tokenizer.apply_chat_template(chat, tokenize=False, add_generation_prompt=True)
    own = [{"role": "system", "content": "You are Quokka."}, *chat]
    assert "SmolLM" not in fmt.render(own, True)
    assert 'if and (eq $i 0) (ne .Role "system")' in ollama.go_template(fmt)


def test_llama3_headers_without_the_bos_text(base_tokenizer):
    tokenizer = with_template(base_tokenizer, LLAMA3, bos="<|endoftext|>")
    fmt = ollama.chat_format_of(tokenizer, adds_bos=True)  # Llama 3's GGUF adds BOS
    assert fmt.user == ("<|start_header_id|>user<|end_header_id|>\n\n", "<|eot_id|>")
    assert fmt.generation == "<|start_header_id|>assistant<|end_header_id|>\n\n"
    assert "<|endoftext|>" not in ollama.go_template(fmt)  # llama.cpp adds BOS itself
    assert ollama.stop_words(fmt, None) == ["<|eot_id|>", "<|start_header_id|>"]


def test_mistral_inst_folds_a_system_turn_into_the_next_user_turn(base_tokenizer):
    fmt = ollama.chat_format_of(with_template(base_tokenizer, MISTRAL_TEMPLATE, bos="<|endoftext|>"), adds_bos=True)
    assert fmt.system is None and fmt.user == ("[INST] ", " [/INST]") and fmt.assistant == ("", "<|im_end|>")
    chat = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hi"}]
    assert fmt.render(chat, True) == "[INST] Be brief.\n\nHi [/INST]"
    assert "{{ $system = .Content }}" in ollama.go_template(fmt)


def test_a_template_that_is_not_per_role_wrappers_gets_no_template(base_tokenizer):
    with pytest.raises(ollama.TemplateNotTranslatable):
        ollama.chat_format_of(with_template(base_tokenizer, NUMBERED))
    text = ollama.modelfile_text("m.gguf", None, "<|im_end|>", {"max_position_embeddings": 100_000},
                                 {"temperature": 0.2, "top_p": 0.9}, "the first user turn is wrapped differently")
    assert "TEMPLATE" not in text.replace("# no TEMPLATE", "")
    assert "FROM ./m.gguf" in text and 'PARAMETER stop "<|im_end|>"' in text
    assert "PARAMETER num_ctx 4096" in text and "PARAMETER temperature 0.2" in text and "PARAMETER top_p 0.9" in text


def test_go_template_braces_in_literal_text_are_escaped():
    fmt = ollama.ChatFormat(user=("{{user}} ", "\n"), assistant=("", "\n"), generation="", system=None)
    assert '{{ "{{" }}user}} ' in ollama.go_template(fmt)


@pytest.mark.parametrize("name", ["Bot😀 名字", "𝒵ed 𠀋", "بوت مرحبا"])
def test_a_unicode_default_system_line_reaches_the_modelfile(base_tokenizer, tmp_path, name):
    """A bot name with an emoji (a surrogate pair in UTF-16), CJK or RTL text: the tuned tokenizer's
    default system line is measured and written into the Modelfile's TEMPLATE unchanged."""
    from jobs.data import encode
    from jobs.data.builtin.identity import system_line
    tokenizer = with_template(base_tokenizer, CHATML)
    line = system_line(name, "作者")
    encode.set_default_system(tokenizer, line)
    fmt = ollama.chat_format_of(tokenizer)
    assert fmt.default_system == line
    gguf = tmp_path / "m.gguf"
    tokenizer.save_pretrained(tmp_path / "tok")
    path, notes = ollama.write_modelfile(gguf, tmp_path / "tok", {}, {})
    text = path.read_text(encoding="utf-8")
    assert not notes and f"<|im_start|>system\n{line}<|im_end|>\n" in text
