"""The prompt Ollama builds from our Modelfile equals the Jinja chat template's, for every template
family the GGUF export supports (ChatML with Qwen2's or SmolLM2's default system line, Llama 3
headers, Mistral's [INST]), with and without a system message. The Go TEMPLATE is rendered by a
small text/template interpreter (tests/jobs/export/gotemplate.py), not by ollama.ChatFormat.render, and
llama.cpp's BOS is put in front only where the GGUF says it adds one."""
import re

import pytest

from jobs.export import ollama
from tests.jobs.export import gotemplate
from tests.jobs.export.templates import LLAMA3, SMOLLM2, with_template
from tests.tiny import CHATML, MISTRAL_TEMPLATE

QWEN2 = ("{%- if messages[0]['role'] == 'system' %}{{- '<|im_start|>system\n' + messages[0]['content'] + "
         "'<|im_end|>\n' }}{%- else %}{{- '<|im_start|>system\nYou are Qwen, created by Alibaba Cloud. "
         "You are a helpful assistant.<|im_end|>\n' }}{%- endif %}{%- for message in messages %}"
         "{%- if message['role'] != 'system' or not loop.first %}{{- '<|im_start|>' + message['role'] + '\n' + "
         "message['content'] + '<|im_end|>' + '\n' }}{%- endif %}{%- endfor %}"
         "{%- if add_generation_prompt %}{{- '<|im_start|>assistant\n' }}{%- endif %}")
# (family, template, bos token, whether the GGUF adds BOS): SmolLM2's BOS is <|im_start|>, not added
FAMILIES = [
    ("chatml", CHATML, None, False),
    ("qwen2", QWEN2, None, False),
    ("smollm2", SMOLLM2, "<|im_start|>", False),
    ("llama3", LLAMA3, "<|endoftext|>", True),
    ("mistral", MISTRAL_TEMPLATE, "<|endoftext|>", True),
]
SYSTEM = {"role": "system", "content": "You are Quokka, made by Marsupial Labs.\nBe brief."}
USER = {"role": "user", "content": "Who are you?"}
REPLY = {"role": "assistant", "content": "I am Quokka.\nAsk me anything."}
CHATS = {"user": [USER], "system+user": [SYSTEM, USER], "multi-turn": [USER, REPLY, USER],
         "system+multi-turn": [SYSTEM, USER, REPLY, USER]}


def jinja_prompt(tokenizer, chat):
    try:
        return tokenizer.apply_chat_template(chat, tokenize=False, add_generation_prompt=True)
    except Exception:  # a template that refuses system turns (Mistral): folded into the next user turn
        folded = [{"role": "user", "content": f"{chat[0]['content']}\n\n{chat[1]['content']}"}, *chat[2:]]
        return tokenizer.apply_chat_template(folded, tokenize=False, add_generation_prompt=True)


def ollama_prompt(go: str, chat, bos: str | None, adds_bos: bool) -> str:
    return (bos if adds_bos else "") + gotemplate.render(go, ollama_messages(chat))


def ollama_messages(chat) -> dict:
    """What Ollama passes its TEMPLATE: .Messages with .Role and .Content."""
    return {"Messages": [{"Role": m["role"], "Content": m["content"]} for m in chat]}


@pytest.mark.parametrize("family,template,bos,adds_bos", FAMILIES, ids=[f[0] for f in FAMILIES])
@pytest.mark.parametrize("chat_name", list(CHATS))
def test_the_modelfile_prompt_is_the_jinja_prompt(base_tokenizer, family, template, bos, adds_bos, chat_name):
    tokenizer = with_template(base_tokenizer, template, bos=bos)
    go = ollama.go_template(ollama.chat_format_of(tokenizer, adds_bos))
    chat = CHATS[chat_name]
    assert ollama_prompt(go, chat, bos, adds_bos) == jinja_prompt(tokenizer, chat)


def test_smollm2_system_turn_keeps_its_opener_in_the_written_modelfile(base_tokenizer, tmp_path):
    """The reported bug: `system\\nYou are Quokka…<|im_end|>` without `<|im_start|>`, because the
    BOS text (<|im_start|> for SmolLM2) was stripped although the GGUF does not add BOS."""
    tokenizer = with_template(base_tokenizer, SMOLLM2, bos="<|im_start|>")
    tokenizer.save_pretrained(tmp_path / "tok")
    gguf_path = tmp_path / "m.gguf"
    gguf_path.write_bytes(b"")
    path, notes = ollama.write_modelfile(gguf_path, tmp_path / "tok", {}, {})
    assert notes == []
    go = re.search(r'TEMPLATE """(.*?)"""', path.read_text(), re.S).group(1)
    for chat in CHATS.values():
        prompt = gotemplate.render(go, ollama_messages(chat))
        assert prompt.startswith("<|im_start|>system\n")
        assert prompt == jinja_prompt(tokenizer, chat)


def test_the_interpreter_reads_go_escapes_and_branches():
    go = '{{ $x := "" }}{{ range $i, $_ := .Messages }}{{ if and (eq $i 0) (ne .Role "a") }}[{{ "{{" }}]' \
         '{{ else if eq .Role "a" }}A{{ $x = .Content }}{{ else }}B{{ end }}{{ end }}{{ $x }}'
    chat = [{"Role": "b", "Content": ""}, {"Role": "a", "Content": "c"}]
    assert gotemplate.render(go, {"Messages": chat}) == "[{{]Ac"
