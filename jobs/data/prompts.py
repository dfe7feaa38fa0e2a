"""Prompt data for GRPO: rows with a prompt (a string, or a list of chat messages) and any other
columns, which the rewards receive by name (an `answer`, test cases...). Auto-detected:
  prompt                 the prompt itself (TRL's "prompt" column; a string stays plain text)
  messages/conversations the turns up to the last user turn (later assistant turns are dropped)
  question / problem / instruction (+ input)   one user message
A chat prompt goes through the chat template with the generation prompt; a text prompt is
tokenized as is (TRL's conversational / standard split)."""
from __future__ import annotations

from dataclasses import dataclass, field

from jobs.messages import say
from jobs.data.conversation import DataError
from jobs.spec import BUILTIN_PROMPT_DATASETS

TEXT_KEYS = ("question", "problem", "instruction", "query")


@dataclass
class PromptRow:
    prompt: str | list          # text, or chat messages
    columns: dict = field(default_factory=dict)
    input_ids: list[int] = field(default_factory=list)


def prompt_of(row: dict):
    """The prompt of one row, or a DataError saying what is wrong with it (the caller names the row)."""
    if "prompt" in row:
        value = row["prompt"]
        if isinstance(value, str) and value.strip() or isinstance(value, list) and value:
            return value
        raise DataError(say("prompt_empty"))
    for key in ("messages", "conversations"):
        if isinstance(row.get(key), list):
            turns = [{"role": t.get("role") or {"human": "user", "gpt": "assistant"}.get(t.get("from"), "user"),
                      "content": t.get("content", t.get("value", ""))} for t in row[key] if isinstance(t, dict)]
            while turns and turns[-1]["role"] != "user":
                turns.pop()
            if turns:
                return turns
            raise DataError(say("prompt_no_user_turn", key=key))
    for key in TEXT_KEYS:
        if isinstance(row.get(key), str) and row[key].strip():
            text = row[key] + (f"\n\n{row['input']}" if isinstance(row.get("input"), str) and row["input"] else "")
            return [{"role": "user", "content": text}]
    raise DataError(say("prompt_missing"))


def is_prompt_row(row: dict) -> bool:
    """Whether GRPO can prompt with this row (the upload notice's test for prompt data)."""
    try:
        prompt_of(row)
    except DataError:
        return False
    return True


def to_prompt_rows(rows: list[dict], problems=None) -> list[PromptRow]:
    """Every row as a PromptRow. Every bad row is found, as SFT's to_conversations finds them: without
    `problems` a DataError names them (the first 10, and how many); with it they are added there."""
    from jobs.data.dataset import Problems, Rows
    rows = rows if isinstance(rows, Rows) else Rows(rows)
    found = problems if problems is not None else Problems()
    used = ("prompt", "messages", "conversations")
    out = []
    for number, where, row in zip(rows.numbers, rows.wheres, rows):
        try:
            out.append(PromptRow(prompt_of(row), {k: v for k, v in row.items() if k not in used}))
        except DataError as exc:
            found.add(say("row_problem", where=where, problem=exc), number)
    error = found.error(rows.name)
    if error and problems is None:
        raise error
    return out


def load_prompt_rows(spec, data_dir=None, log=print) -> list[PromptRow]:
    """Every prompt of spec.dataset, or one DataError naming every bad row: the ones the reader
    refused and the ones without a prompt together (the first 10 by number, and how many)."""
    if spec.dataset in BUILTIN_PROMPT_DATASETS:
        from jobs.data.builtin.arithmetic import arithmetic_rows
        return to_prompt_rows(arithmetic_rows(seed=spec.seed))
    from jobs.data.dataset import _raise_for, _read
    rows, problems = _read(spec, "dataset", data_dir, False, None, log)
    prompts = to_prompt_rows(rows, problems)
    _raise_for(rows, problems)
    return prompts


def render(tokenizer, prompt) -> str:
    """The prompt as the model sees it."""
    if isinstance(prompt, str):
        return prompt
    return tokenizer.apply_chat_template(prompt, tokenize=False, add_generation_prompt=True)


def encode_prompts(tokenizer, rows: list[PromptRow], max_length: int) -> list[PromptRow]:
    """Token ids of every prompt, keeping the last `max_length` tokens of a longer one."""
    for row in rows:
        text = render(tokenizer, row.prompt)
        ids = tokenizer(text, add_special_tokens=isinstance(row.prompt, str))["input_ids"]
        row.input_ids = ids[-max_length:]
    return rows


def preview_rows(spec, n: int = 3, data_dir=None, access=None) -> list[dict]:
    """jobs.data.dataset.preview_rows for prompt data: the first n prompts as the model sees them
    (`segments`: the rendered prompt, untrained), their `tokens`, and the `columns` the rewards get."""
    from jobs.data import encode
    from jobs.models import load as models
    from jobs.spec import JobSpec
    if access is not None:
        spec = access.check_spec(JobSpec.from_dict(spec.to_dict()))
    tokenizer = models.load_tokenizer(models.resolve_model(spec.model, data_dir, log=lambda _line: None))
    encode.ensure_chat_template(tokenizer)
    if spec.dataset in BUILTIN_PROMPT_DATASETS:
        rows = load_prompt_rows(spec, data_dir)[:n]
    else:
        from jobs.data.dataset import scan_rows
        found, problems = scan_rows(spec.dataset, first=n)
        error = problems.error(found.name)
        if error:
            raise error
        rows = to_prompt_rows(found)
    rows = encode_prompts(tokenizer, rows, spec.max_seq_length)
    return [{"segments": [(render(tokenizer, row.prompt), False)], "tokens": len(row.input_ids),
             "columns": row.columns} for row in rows]
