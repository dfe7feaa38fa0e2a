"""The Ollama `Modelfile` written beside a GGUF: FROM, the chat template as a Go template, the
default system prompt, stop tokens and sampling PARAMETERs.

A Jinja chat template cannot be translated to Go in general, but the chat templates of the
supported families (ChatML for Qwen2/SmolLM, Llama 3's headers, Mistral's [INST]) all wrap each
message in a fixed prefix and suffix per role. So the template is *measured* rather than parsed:
it is rendered on conversations with marker contents, the text around each marker gives the
role's prefix and suffix, the generation prompt and any default system prompt the template
inserts. A default system prompt the template inserts is inserted by the Go template too, so a
Modelfile SYSTEM (a system turn) replaces it as it does in the Jinja. The result is rendered back
in Python and compared with the Jinja output on several
conversations; only a format that reproduces them exactly is written as TEMPLATE. Otherwise the
Modelfile has no TEMPLATE and Ollama uses the chat template stored in the GGUF (it recognises the
common ones), and the export says so."""
from __future__ import annotations

import json
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

from jobs.export.files import atomic_output
from jobs.messages import say

Render = Callable[[list[dict], bool], str]
MARK = {"system": "FTsysMARK0", "user1": "FTusrMARK1", "assistant": "FTastMARK2", "user2": "FTusrMARK3"}
SPECIAL_TOKEN = re.compile(r"^(<\|[^|<>]+\|>|\[INST\]|<s>|<start_of_turn>)")
DEFAULT_CONTEXT = 4096


class TemplateNotTranslatable(ValueError):
    pass


@dataclass
class ChatFormat:
    user: tuple[str, str]
    assistant: tuple[str, str]
    generation: str
    system: tuple[str, str] | None  # None: the template refuses or drops system messages
    default_system: str | None = None

    def render(self, messages: list[dict], add_generation_prompt: bool) -> str:
        """What the Go template below produces, in Python (to check it against the Jinja)."""
        out, pending_system = [], ""
        for i, message in enumerate(messages):
            role, content, last = message["role"], message["content"], i == len(messages) - 1
            if i == 0 and role != "system" and self.default_system is not None:
                out.append(self.system[0] + self.default_system + self.system[1])
            if role == "system" and self.system:
                out.append(self.system[0] + content + self.system[1])
            elif role == "system":
                pending_system = content
            elif role == "user":
                if pending_system:
                    content, pending_system = f"{pending_system}\n\n{content}", ""
                out.append(self.user[0] + content + self.user[1])
            elif role == "assistant":
                out.append(self.assistant[0] + content + (self.assistant[1] if not last else ""))
            if last and role != "assistant" and add_generation_prompt:
                out.append(self.generation)
        return "".join(out)


def _between(text: str, start: str | None, end: str | None) -> str:
    begin = text.index(start) + len(start) if start else 0
    finish = text.index(end, begin) if end else len(text)
    return text[begin:finish]


def _strip_prefix(text: str, prefix: str, what: str) -> str:
    if not text.startswith(prefix):
        raise TemplateNotTranslatable(say("template_part_not_fixed", what=what))
    return text[len(prefix):]


def measure(render: Render, bos: str = "") -> ChatFormat:
    """The per-role wrappers of a chat template, from renders with marker contents."""
    u1, a2, u3, s0 = ({"role": r, "content": MARK[k]} for k, r in
                      (("user1", "user"), ("assistant", "assistant"), ("user2", "user"), ("system", "system")))
    try:
        three, three_gen, two = render([u1, a2, u3], False), render([u1, a2, u3], True), render([u1, a2], False)
    except Exception as exc:  # a template can raise anything (raise_exception, missing keys)
        raise TemplateNotTranslatable(say("template_fails", detail=exc)) from None
    generation = _strip_prefix(three_gen, three, "generation prompt")
    user_suffix = _between(three, MARK["user2"], None)
    assistant_prefix = _strip_prefix(_between(three, MARK["user1"], MARK["assistant"]), user_suffix, "reply prefix")
    assistant_suffix = _between(two, MARK["assistant"], None)
    user_prefix = _strip_prefix(_between(three, MARK["assistant"], MARK["user2"]), assistant_suffix, "user prefix")
    head = _strip_prefix(_between(three, None, MARK["user1"]), bos, "start")
    if not head.endswith(user_prefix):
        raise TemplateNotTranslatable(say("template_first_user_turn"))
    head = head[: len(head) - len(user_prefix)]
    fmt = ChatFormat((user_prefix, user_suffix), (assistant_prefix, assistant_suffix), generation, None)
    _measure_system(render, fmt, bos, head, s0, u1)
    return fmt


def _measure_system(render: Render, fmt: ChatFormat, bos: str, head: str, s0: dict, u1: dict) -> None:
    """A system turn is either wrapped like the others, or (fmt.system None) folded into the next
    user turn as "system\n\nuser" -- also what the Go template does when the template refuses it."""
    try:
        with_system = render([s0, u1], False)
    except Exception:  # e.g. Mistral's "Only user and assistant roles are supported!"
        with_system = ""
    before = _between(with_system, None, MARK["system"]) if MARK["system"] in with_system else None
    between = _between(with_system, MARK["system"], MARK["user1"]) if before is not None else None
    if before is None or (before == bos + fmt.user[0] and between == "\n\n"):
        if head:
            raise TemplateNotTranslatable(say("template_unexplained_head"))
        return
    prefix = _strip_prefix(before, bos, "system prefix")
    if not between.endswith(fmt.user[0]):
        raise TemplateNotTranslatable(say("template_system_then_user"))
    fmt.system = (prefix, between[: len(between) - len(fmt.user[0])])
    if head:
        if not (head.startswith(prefix) and head.endswith(fmt.system[1])):
            raise TemplateNotTranslatable(say("template_first_not_system"))
        fmt.default_system = head[len(prefix): len(head) - len(fmt.system[1])]


def check(fmt: ChatFormat, render: Render, bos: str) -> None:
    """Raise unless fmt reproduces the Jinja template on sample conversations (multi-line text too);
    conversations with a system turn are skipped when the template refuses them."""
    u, a = {"role": "user", "content": "Hi\nthere"}, {"role": "assistant", "content": "Hello!\nHow can I help?"}
    s = {"role": "system", "content": "Be brief."}
    cases = [[u], [u, a, u], [s, u], [s, u, a, u]]  # chats end with the user: Ollama then generates
    for conversation in cases:
        for gen in (True, False):
            try:
                expected = render(conversation, gen)
            except Exception:
                if conversation[0]["role"] == "system":
                    continue
                raise
            expected = expected[len(bos):] if bos and expected.startswith(bos) else expected
            if fmt.render(conversation, gen) != expected:
                raise TemplateNotTranslatable(say("template_not_reproduced", count=len(conversation)))


def _go_text(text: str) -> str:
    """Literal text for a Go template inside the Modelfile's triple quotes: `{{` would start an
    action (written as the action `{{ "{{" }}`), and the rest goes through _go_char."""
    return '{{ "{{" }}'.join("".join(map(_go_char, piece)) for piece in text.split("{{"))


def _go_char(char: str) -> str:
    """Ollama's Modelfile parser (parser/parser.go in ollama/ollama) ends a value at three quotes
    followed by a space or a line end, and silently drops each rune that Go's strconv.IsPrint
    rejects (a right-to-left mark, the zero-width joiner inside an emoji; Python's isprintable is
    the same test). So a quote and each such rune become a Go string action with the rune's escape,
    which renders the same text; backslashes, newlines and printable text (emoji, CJK, Arabic
    letters) stay literal: neither the parser nor Go's template text reads escapes."""
    if char != '"' and (char == "\n" or char.isprintable()):
        return char
    code = ord(char)
    return '{{ "\\u%04x" }}' % code if code < 0x10000 else '{{ "\\U%08x" }}' % code


def go_template(fmt: ChatFormat) -> str:
    """One line of Go template over Ollama's .Messages; no whitespace-trimming markers, so every
    newline of the wrappers is kept exactly."""
    t = _go_text
    if fmt.system:
        system = f'{t(fmt.system[0])}{{{{ .Content }}}}{t(fmt.system[1])}'
        user_content = "{{ .Content }}"
    else:  # folded into the next user turn, as Ollama's own Mistral template does
        system = "{{ $system = .Content }}"
        user_content = '{{ if $system }}{{ $system }}\n\n{{ $system = "" }}{{ end }}{{ .Content }}'
    generation = f"{{{{ if $last }}}}{t(fmt.generation)}{{{{ end }}}}"
    default = ""
    if fmt.default_system is not None:  # what the template inserts when a chat has no system turn
        default = (f'{{{{ if and (eq $i 0) (ne .Role "system") }}}}'
                   f'{t(fmt.system[0] + fmt.default_system + fmt.system[1])}{{{{ end }}}}')
    return ('{{ $system := "" }}{{ range $i, $_ := .Messages }}'
            f'{{{{ $last := eq (len (slice $.Messages $i)) 1 }}}}{default}'
            f'{{{{ if eq .Role "system" }}}}{system}{generation}'
            f'{{{{ else if eq .Role "user" }}}}{t(fmt.user[0])}{user_content}{t(fmt.user[1])}{generation}'
            f'{{{{ else if eq .Role "assistant" }}}}{t(fmt.assistant[0])}{{{{ .Content }}}}'
            f'{{{{ if not $last }}}}{t(fmt.assistant[1])}{{{{ end }}}}{{{{ end }}}}{{{{ end }}}}')


def stop_words(fmt: ChatFormat, eos: str | None) -> list[str]:
    """End-of-turn markers: the reply suffix, the tokenizer's EOS, the token opening a user turn."""
    words = [fmt.assistant[1].strip(), eos or ""]
    opener = SPECIAL_TOKEN.match(fmt.user[0].lstrip())
    if opener:
        words.append(opener.group(1))
    return [w for w in dict.fromkeys(words) if w]


def _quoted(text: str) -> str:
    """A Modelfile value in triple quotes; go_template's text never holds a `"` outside its own
    actions (_go_text), and those never make three in a row."""
    assert '"""' not in text, "go_template wrote three quotes in a row"
    return f'"""{text}"""'


def modelfile_text(gguf_name: str, fmt: ChatFormat | None, eos: str | None, config: dict,
                   generation: dict, reason: str = "") -> str:
    lines = ["# Ollama: ollama create my-model -f Modelfile   then   ollama run my-model", f"FROM ./{gguf_name}"]
    if fmt is not None:
        lines.append(f"TEMPLATE {_quoted(go_template(fmt))}")
        lines += [f"PARAMETER stop {json.dumps(word)}" for word in stop_words(fmt, eos)]
    else:
        lines.append(f"# no TEMPLATE: {reason}; Ollama uses the chat template stored in the GGUF")
        if eos:
            lines.append(f"PARAMETER stop {json.dumps(eos)}")
    context = min(int(config.get("max_position_embeddings") or DEFAULT_CONTEXT), DEFAULT_CONTEXT)
    lines.append(f"PARAMETER num_ctx {context}")
    for key in ("temperature", "top_p", "top_k", "repetition_penalty"):
        if generation.get(key) is not None:
            name = "repeat_penalty" if key == "repetition_penalty" else key
            lines.append(f"PARAMETER {name} {generation[key]}")
    return "\n".join(lines) + "\n"


def encoding_adds_bos(tokenizer) -> bool:
    """Whether tokenizing a prompt puts the BOS token in front by itself (what llama.cpp does
    when a GGUF does not say)."""
    if tokenizer.bos_token_id is None:
        return False
    return tokenizer("x", add_special_tokens=True)["input_ids"][:1] == [tokenizer.bos_token_id]


def gguf_adds_bos(tokenizer_dir: Path, tokenizer) -> bool:
    """The `tokenizer.ggml.add_bos_token` our GGUF carries (gguf.SpecialVocab reads it from the
    tokenizer files, as vocab.py writes it); the tokenizer's own behaviour where the files are silent."""
    import gguf
    flag = gguf.SpecialVocab(tokenizer_dir, load_merges=False).add_special_token.get("bos")
    return encoding_adds_bos(tokenizer) if flag is None else bool(flag)


def chat_format_of(tokenizer, adds_bos: bool | None = None) -> ChatFormat:
    """The verified format of a tokenizer's chat template (TemplateNotTranslatable if none).
    adds_bos: whether the runtime (llama.cpp, from the GGUF's add_bos flag) puts BOS in front of
    the prompt itself; only then is a BOS the template renders left out of the Go template. SmolLM2's
    BOS is `<|im_start|>` and its GGUF adds none: stripping it lost the first turn's opener."""
    def render(messages: list[dict], generation: bool) -> str:
        return tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=generation)
    adds_bos = encoding_adds_bos(tokenizer) if adds_bos is None else adds_bos
    bos = tokenizer.bos_token or ""
    bos = bos if adds_bos and bos and render([{"role": "user", "content": "x"}], False).startswith(bos) else ""
    fmt = measure(render, bos)
    check(fmt, render, bos)
    return fmt


def write_modelfile(gguf_path: Path, tokenizer_dir: Path, config: dict, generation: dict
                    ) -> tuple[Path, list[str]]:
    """Write `Modelfile` beside the GGUF; returns (path, notes)."""
    text, notes = modelfile_for(gguf_path.name, tokenizer_dir, config, generation)
    path = gguf_path.parent / "Modelfile"
    with atomic_output(path, folder=False) as tmp:
        tmp.write_text(text, encoding="utf-8")
    return path, notes


def modelfile_for(gguf_name: str, tokenizer_dir: Path, config: dict, generation: dict) -> tuple[str, list[str]]:
    """(the Modelfile's text, notes for the user). `generation` is the base's generation_config.json
    (sampling defaults), possibly empty."""
    from jobs.data.encode import ensure_chat_template
    from jobs.models.load import load_tokenizer
    tokenizer = load_tokenizer(str(tokenizer_dir))
    ensure_chat_template(tokenizer)
    notes: list[str] = []
    try:
        fmt, reason = chat_format_of(tokenizer, gguf_adds_bos(tokenizer_dir, tokenizer)), ""
    except TemplateNotTranslatable as exc:
        fmt, reason = None, str(exc)
        notes.append(say("export_note_no_template", message=reason))
    return modelfile_text(gguf_name, fmt, tokenizer.eos_token, config, generation, reason), notes
