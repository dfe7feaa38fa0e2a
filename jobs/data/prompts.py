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
PROMPT_DATA_HINT = ("a row needs a prompt: a `prompt` column (text or messages), `messages`, or a `question` / "
                    "`problem` / `instruction` column")


@dataclass
class PromptRow:
    prompt: str | list          # text, or chat messages
    columns: dict = field(default_factory=dict)
    input_ids: list[int] = field(default_factory=list)


def prompt_of(row: dict, number: int):
    """The prompt of one row, or DataError naming the row."""
    if "prompt" in row:
        value = row["prompt"]
        if isinstance(value, str) and value.strip() or isinstance(value, list) and value:
            return value
        raise DataError(say("row_problem", where=say("at_row", number=number), problem=say("prompt_empty")))
    for key in ("messages", "conversations"):
        if isinstance(row.get(key), list):
            turns = [{"role": t.get("role") or {"human": "user", "gpt": "assistant"}.get(t.get("from"), "user"),
                      "content": t.get("content", t.get("value", ""))} for t in row[key] if isinstance(t, dict)]
            while turns and turns[-1]["role"] != "user":
                turns.pop()
            if turns:
                return turns
            raise DataError(say("row_problem", where=say("at_row", number=number),
                                problem=say("prompt_no_user_turn", key=key)))
    for key in TEXT_KEYS:
        if isinstance(row.get(key), str) and row[key].strip():
            text = row[key] + (f"\n\n{row['input']}" if isinstance(row.get("input"), str) and row["input"] else "")
            return [{"role": "user", "content": text}]
    raise DataError(f"row {number}: {PROMPT_DATA_HINT}")


def to_prompt_rows(rows: list[dict], numbers: list[int] | None = None) -> list[PromptRow]:
    used = ("prompt", "messages", "conversations")
    out = []
    for i, row in enumerate(rows):
        prompt = prompt_of(row, numbers[i] if numbers else i + 1)
        out.append(PromptRow(prompt, {k: v for k, v in row.items() if k not in used}))
    return out


def load_prompt_rows(spec, data_dir=None, log=print) -> list[PromptRow]:
    if spec.dataset in BUILTIN_PROMPT_DATASETS:
        from jobs.data.builtin.arithmetic import arithmetic_rows
        return to_prompt_rows(arithmetic_rows(seed=spec.seed))
    from jobs.data.dataset import load_rows
    rows = load_rows(spec, data_dir, log=log)
    return to_prompt_rows(list(rows), rows.numbers)


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
        rows = to_prompt_rows(list(found), found.numbers)
    rows = encode_prompts(tokenizer, rows, spec.max_seq_length)
    return [{"segments": [(render(tokenizer, row.prompt), False)], "tokens": len(row.input_ids),
             "columns": row.columns} for row in rows]
