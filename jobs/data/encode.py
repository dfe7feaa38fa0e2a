"""Turn conversations into token ids and labels through the model's own chat template.

Only assistant turns are trained: every other token gets the label -100. The split is found by
rendering the template on growing prefixes of the conversation (the approach of TRL's
assistant-only loss and LLaMA-Factory's supervised processor), so it works with any template that
renders earlier turns the same way whatever follows them."""
from __future__ import annotations

from dataclasses import dataclass

import torch

from jobs.messages import say
from jobs.data.conversation import DataError, Message

IGNORE_INDEX = -100
# Used only when a tokenizer has no chat template of its own (base models).
DEFAULT_CHAT_TEMPLATE = (
    "{% for message in messages %}<|im_start|>{{ message['role'] }}\n{{ message['content'] }}<|im_end|>\n"
    "{% endfor %}{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)


@dataclass
class Example:
    input_ids: list[int]
    labels: list[int]

    @property
    def trained_tokens(self) -> int:
        return len(self.labels) - self.labels.count(IGNORE_INDEX)   # list.count: C speed, 800k rows


def ensure_chat_template(tokenizer) -> bool:
    """Give a template-less tokenizer a ChatML template. Returns True if it had to."""
    if getattr(tokenizer, "chat_template", None):
        return False
    tokenizer.chat_template = DEFAULT_CHAT_TEMPLATE
    return True


SYSTEM_PRELUDE_START, SYSTEM_PRELUDE_END = "{#- fusetune:default-system -#}", "{#- /fusetune:default-system -#}"


def jinja_string_literal(text: str) -> str:
    """`text` as a Jinja string literal that no user text can break out of: everything but ASCII
    letters, digits and spaces is escaped. Why not json.dumps: it writes a character beyond the
    BMP (an emoji) as a UTF-16 surrogate pair, and Jinja decodes each half on its own into a lone
    surrogate that no tokenizer can encode; Jinja's own escapes are Python's, so `\\U0001f600`."""
    def escape(char: str) -> str:
        if char.isascii() and (char.isalnum() or char == " "):
            return char
        code = ord(char)
        return f"\\u{code:04x}" if code < 0x10000 else f"\\U{code:08x}"
    return '"' + "".join(escape(char) for char in text) + '"'


def set_default_system(tokenizer, system: str, base_marker: str | None = None) -> bool:
    """Make `system` the system message of every conversation that has none, by putting a short
    Jinja prelude in front of the tokenizer's own chat template (replacing an earlier one).

    Why a prelude and not string surgery: it works with any template that renders a leading
    system message, and it overrides defaults a template inserts itself (SmolLM2's inserts "You
    are a helpful AI assistant named SmolLM, trained by Hugging Face" when there is none). The
    tokenizer is saved with the adapter, so everything that chats with the tuned model through
    its tokenizer starts from this line. Returns False when the template cannot be changed
    (a dict of named templates).

    `base_marker`: a conversation whose system message is exactly this string is rendered as the
    base template renders it with no system message at all (its own default line, or none). The
    identity rows use it to train under the base model's own template too (jobs/data/builtin/identity.py)."""
    template = getattr(tokenizer, "chat_template", None)
    if not isinstance(template, str):
        return False
    if template.startswith(SYSTEM_PRELUDE_START):
        template = template[template.index(SYSTEM_PRELUDE_END) + len(SYSTEM_PRELUDE_END):]
    literal = jinja_string_literal(system)
    branches = [("messages[0]['role'] != 'system'",
                 f"{{%- set messages = [{{'role': 'system', 'content': {literal}}}] + messages %}}")]
    if base_marker:
        branches.insert(0, (f"messages[0]['role'] == 'system' and messages[0]['content'] == "
                            f"{jinja_string_literal(base_marker)}", "{%- set messages = messages[1:] %}"))
    prelude = "".join(f"{{%- {'elif' if i else 'if'} messages and {test} %}}{body}"
                      for i, (test, body) in enumerate(branches)) + "{%- endif %}"
    tokenizer.chat_template = SYSTEM_PRELUDE_START + prelude + SYSTEM_PRELUDE_END + template
    return True


def accepts_system(tokenizer) -> bool:
    """Whether the chat template renders a system message (some, like Mistral's, raise on one)."""
    from jinja2.exceptions import TemplateError
    try:
        tokenizer.apply_chat_template([{"role": "system", "content": "S"}, {"role": "user", "content": "U"}],
                                      tokenize=False)
    except TemplateError:
        return False
    return True


def _render(tokenizer, messages: list[Message], generation_prompt: bool) -> str:
    return tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=generation_prompt)


def segments(tokenizer, messages: list[Message]) -> list[tuple[str, bool]]:
    """The rendered conversation as (text, trained) pieces, in order."""
    pieces: list[tuple[str, bool]] = []
    done = ""
    for i, message in enumerate(messages):
        if message["role"] != "assistant":
            continue
        prompt = _render(tokenizer, messages[:i], generation_prompt=True)
        full = _render(tokenizer, messages[: i + 1], generation_prompt=False)
        if not prompt.startswith(done) or not full.startswith(prompt):
            raise DataError(say("template_rewrites_turns"))
        pieces.append((prompt[len(done):], False))
        pieces.append((full[len(prompt):], True))
        done = full
    # a conversation that ends with an answer was rendered whole just above: no third render
    last_answered = messages[-1]["role"] == "assistant"
    rest = "" if last_answered else _render(tokenizer, messages, generation_prompt=False)[len(done):]
    if rest:
        pieces.append((rest, False))
    return [(text, trained) for text, trained in pieces if text]


def encode(tokenizer, conversation: list[Message] | str, max_length: int) -> Example:
    """Token ids and labels for one row, truncated to max_length."""
    if isinstance(conversation, str):
        ids = tokenizer(conversation, add_special_tokens=True)["input_ids"]
        if tokenizer.eos_token_id is not None:
            ids = ids + [tokenizer.eos_token_id]
        ids = ids[:max_length]
        return Example(ids, list(ids))
    input_ids: list[int] = []
    labels: list[int] = []
    for text, trained in segments(tokenizer, conversation):
        ids = tokenizer(text, add_special_tokens=False)["input_ids"]
        input_ids += ids
        labels += ids if trained else [IGNORE_INDEX] * len(ids)
    return Example(input_ids[:max_length], labels[:max_length])


def encode_all(tokenizer, conversations, max_length: int, log=print) -> list[Example]:
    examples = [encode(tokenizer, c, max_length) for c in conversations]
    kept = [e for e in examples if e.trained_tokens > 0]
    dropped = len(examples) - len(kept)
    if dropped:
        log(f"warning: {dropped} of {len(examples)} rows have no answer tokens within max_seq_length="
            f"{max_length} and are skipped; raise max_seq_length to keep them")
    if not kept:
        raise DataError(say("no_row_answer_tokens", length=max_length))
    return kept


def collate(examples: list[Example], pad_id: int) -> dict[str, torch.Tensor]:
    """Right-pad a micro-batch; padding is masked out of attention and loss."""
    width = max(len(e.input_ids) for e in examples)
    ids = torch.full((len(examples), width), pad_id, dtype=torch.long)
    labels = torch.full((len(examples), width), IGNORE_INDEX, dtype=torch.long)
    mask = torch.zeros((len(examples), width), dtype=torch.long)
    for row, e in enumerate(examples):
        n = len(e.input_ids)
        ids[row, :n] = torch.tensor(e.input_ids)
        labels[row, :n] = torch.tensor(e.labels)
        mask[row, :n] = 1
    return {"input_ids": ids, "labels": labels, "attention_mask": mask}


def label_count(batch: dict[str, torch.Tensor]) -> int:
    """Tokens the loss is taken over: labels after the causal shift that are not ignored."""
    return int((batch["labels"][:, 1:] != IGNORE_INDEX).sum())


def preview(tokenizer, conversations, max_length: int, n: int = 3) -> list[dict]:
    """The first n rows as the model sees them: rendered pieces marked trained or not, cut at
    max_length tokens like training cuts them (so a preview answer stays small, whatever the row)."""
    out = []
    for conversation in conversations[:n]:
        example = encode(tokenizer, conversation, max_length)
        if isinstance(conversation, str):
            pieces = [(tokenizer.decode(example.input_ids), True)]
        else:
            pieces = _clip(tokenizer, segments(tokenizer, conversation), max_length)
        out.append({"segments": pieces, "tokens": len(example.input_ids),
                    "trained_tokens": example.trained_tokens,
                    "truncated": len(example.input_ids) >= max_length})
    return out


def _clip(tokenizer, pieces: list[tuple[str, bool]], max_length: int) -> list[tuple[str, bool]]:
    """The pieces up to max_length tokens; the piece that crosses it is cut there."""
    kept, used = [], 0
    for text, trained in pieces:
        ids = tokenizer(text, add_special_tokens=False)["input_ids"]
        if used + len(ids) <= max_length:
            kept.append((text, trained))
            used += len(ids)
            continue
        if max_length > used:
            kept.append((tokenizer.decode(ids[:max_length - used]), trained))
        break
    return kept
