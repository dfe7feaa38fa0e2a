"""Preference rows: detect their format, read them into prompt + answers, and encode each answer.

Formats, from the keys of the first row (dataset_format: auto):
- `prompt` + `chosen` + `rejected`: TRL's explicit-prompt preference form; each value a string
  (prompt -> one user turn, answers -> one assistant turn) or a message list
  ([{role, content}], TRL's "conversational" form: the prompt may hold a system turn and history);
- `chosen` + `rejected` whole conversations (message lists) with an implicit shared prompt: the
  longest common prefix of messages is the prompt, the rest of each is the answer (TRL's
  `extract_prompt` does the same);
- `conversations` + `chosen` + `rejected`: LLaMA-Factory's sharegpt preference form (from/value
  turns; chosen/rejected one turn or a list of turns);
- `prompt` + `completion` + `label` (bool): TRL's unpaired preference form, for KTO.

Encoding: the prompt rendered by the chat template with the generation prompt, then the answer as
the rest of the full rendering (TRL's DPO tokenises prompt and completion apart the same way);
labels only on the answer (-100 on the prompt, as jobs/data/encode.py masks SFT rows).
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from jobs.messages import say
from jobs.data.conversation import DataError, Message
from jobs.data.encode import IGNORE_INDEX, Example

PAIR_FORMATS = ("explicit", "implicit", "sharegpt_pairs")
UNPAIRED_FORMAT = "unpaired"
ROLE_ALIASES = {"human": "user", "user": "user", "gpt": "assistant", "assistant": "assistant",
                "model": "assistant", "bot": "assistant", "system": "system"}


@dataclass
class PreferenceRow:
    """A read row: the prompt messages and the answer(s) as assistant messages.

    Pairs: `chosen` and `rejected`. Unpaired (KTO): `chosen` is the completion, `rejected` is
    None, and `label` says whether it is desirable."""
    prompt: list[Message]
    chosen: list[Message]
    rejected: list[Message] | None = None
    label: bool | None = None


def preference_format(row: dict[str, Any]) -> str | None:
    """explicit, implicit, sharegpt_pairs, unpaired, or None (not a preference row)."""
    keys = set(row)
    if {"prompt", "completion", "label"} <= keys:
        return UNPAIRED_FORMAT
    if {"chosen", "rejected"} <= keys:
        if "conversations" in keys:
            return "sharegpt_pairs"
        return "explicit" if "prompt" in keys else "implicit"
    return None


def is_preference_row(row: dict[str, Any]) -> bool:
    return isinstance(row, dict) and preference_format(row) is not None


def _role(value: Any, turn: int) -> str:
    role = ROLE_ALIASES.get(str(value).lower()) if value is not None else None
    if role is None:
        raise DataError(say("turn_bad_role", turn=turn, role=value, choices=", ".join(sorted(ROLE_ALIASES))))
    return role


def _turns(value: Any, key: str, default_role: str) -> list[Message]:
    """A string (one turn of `default_role`), one message, or a list of messages (role/content or
    from/value) as messages."""
    if isinstance(value, str):
        return [{"role": default_role, "content": value}]
    if isinstance(value, dict):
        value = [value]
    if not isinstance(value, list) or not value:
        raise DataError(say("field_not_turns", key=key))
    out = []
    for i, turn in enumerate(value, 1):
        if not isinstance(turn, dict):
            raise DataError(say("field_turn_not_message", key=key, turn=i))
        text = turn.get("content", turn.get("value"))
        if not isinstance(text, str):
            raise DataError(say("field_turn_needs_text", key=key, turn=i))
        out.append({"role": _role(turn.get("role", turn.get("from")), i), "content": text})
    return out


def _split_implicit(chosen: list[Message], rejected: list[Message]) -> tuple[list[Message], list, list]:
    shared = 0
    while shared < min(len(chosen), len(rejected)) and chosen[shared] == rejected[shared]:
        shared += 1
    while shared and chosen[shared - 1]["role"] == "assistant":  # the answers start at an assistant turn
        shared -= 1
    if not shared:
        raise DataError(say("pair_no_shared_prompt"))
    return chosen[:shared], chosen[shared:], rejected[shared:]


def _label(value: Any, text_labels: bool = False) -> bool:
    """A KTO label: a boolean only (TRL's KTO `label` column is bool). "true" or 1 is refused, not
    guessed at: a quoted "false" read as text, or a 0/1 score column, would flip a row silently. A CSV
    has no booleans, so there (`text_labels`) the words true/false are read, as pandas reads them."""
    if isinstance(value, bool):
        return value
    if text_labels and isinstance(value, str) and value.strip().lower() in ("true", "false"):
        return value.strip().lower() == "true"
    raise DataError(say("label_not_bool", value=value))


def csv_rows(rows) -> bool:
    """Whether `rows` (jobs.data.dataset.Rows) are a CSV file's: every value is text there."""
    return str(getattr(rows, "name", "")).lower().endswith(".csv")


def read_row(row: dict[str, Any], fmt: str | None = None, text_labels: bool = False) -> PreferenceRow:
    """One row as a PreferenceRow, or a DataError naming the field. `text_labels`: the row is from a
    CSV, whose KTO labels are the words true/false."""
    fmt = fmt or preference_format(row)
    if fmt == UNPAIRED_FORMAT:
        return PreferenceRow(_turns(row["prompt"], "prompt", "user"),
                             _turns(row["completion"], "completion", "assistant"), None,
                             _label(row["label"], text_labels))
    if fmt == "sharegpt_pairs":
        prompt = _turns(row["conversations"], "conversations", "user")
    elif fmt == "explicit":
        prompt = _turns(row["prompt"], "prompt", "user")
    elif fmt == "implicit":
        for key in ("chosen", "rejected"):
            if not isinstance(row[key], list):
                raise DataError(say("pair_needs_conversation", key=key))
        return PreferenceRow(*_split_implicit(_turns(row["chosen"], "chosen", "user"),
                                              _turns(row["rejected"], "rejected", "user")))
    else:
        raise DataError(say("not_preference_row"))
    return PreferenceRow(prompt, _turns(row["chosen"], "chosen", "assistant"),
                         _turns(row["rejected"], "rejected", "assistant"))


def answer_text(messages: list[Message]) -> str:
    return "".join(m["content"] for m in messages)


def _render(tokenizer, messages: list[Message], generation_prompt: bool) -> str:
    return tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=generation_prompt)


def render_parts(tokenizer, prompt: list[Message], answer: list[Message]) -> tuple[str, str]:
    """(prompt text with the generation prompt, the answer's text as the template renders it)."""
    head = _render(tokenizer, prompt, generation_prompt=True)
    full = _render(tokenizer, prompt + answer, generation_prompt=False)
    if not full.startswith(head):
        raise DataError(say("template_not_prefix_stable_pair"))
    return head, full[len(head):]


def encode_answer(tokenizer, prompt: list[Message], answer: list[Message], max_length: int) -> Example:
    """Prompt tokens (label -100) + answer tokens (trained), cut at max_length."""
    head, tail = render_parts(tokenizer, prompt, answer)
    prompt_ids = tokenizer(head, add_special_tokens=False)["input_ids"]
    answer_ids = tokenizer(tail, add_special_tokens=False)["input_ids"]
    ids = (prompt_ids + answer_ids)[:max_length]
    labels = ([IGNORE_INDEX] * len(prompt_ids) + answer_ids)[:max_length]
    return Example(ids, labels)


def side_tokens(tokenizer, row: PreferenceRow, max_length: int = 10 ** 9) -> list[tuple[int, int]]:
    """(tokens, answer tokens) of each side (prompt + answer), cut at max_length."""
    sides = [row.chosen] + ([row.rejected] if row.rejected is not None else [])
    examples = [encode_answer(tokenizer, row.prompt, side, max_length) for side in sides]
    return [(len(e.input_ids), e.trained_tokens) for e in examples]


def pair_tokens(tokenizer, row: PreferenceRow) -> int:
    """Tokens of the longest side (prompt + answer), uncut: what must fit max_seq_length."""
    return max(total for total, _ in side_tokens(tokenizer, row))


def _clip(tokenizer, text: str, budget: int) -> tuple[str, int]:
    ids = tokenizer(text, add_special_tokens=False)["input_ids"]
    return (text, len(ids)) if len(ids) <= budget else (tokenizer.decode(ids[:max(0, budget)]), budget)


def preview_pairs(rows: list[dict[str, Any]], tokenizer, max_seq_length: int, limit: int = 3,
                  text_labels: bool = False) -> list[dict]:
    """The first `limit` preference rows as the model sees them, for the studio's pair preview:
    {prompt, chosen, rejected} (KTO rows: {prompt, completion, label}) of strings. `prompt` is the
    chat-templated prompt (with the generation prompt), each answer the trained text that follows
    it, cut where max_seq_length cuts training. A row that cannot be read gives {error: why}."""
    out = []
    for row in rows[:limit]:
        try:
            pref = read_row(row, text_labels=text_labels)
            sides = {"chosen": pref.chosen} if pref.rejected is None else {"chosen": pref.chosen,
                                                                          "rejected": pref.rejected}
            item: dict[str, Any] = {}
            for name, answer in sides.items():
                head, tail = render_parts(tokenizer, pref.prompt, answer)
                head, used = _clip(tokenizer, head, max_seq_length)
                item["prompt"] = head
                item[name] = _clip(tokenizer, tail, max_seq_length - used)[0]
            if pref.rejected is None:
                item = {"prompt": item["prompt"], "completion": item["chosen"], "label": pref.label}
            out.append(item)
        except DataError as exc:
            out.append({"error": str(exc)})
    return out
