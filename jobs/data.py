"""Training data: load a file / hub dataset / the built-in one, detect its format, and turn every
row into a list of chat messages. Errors name the file, the row and the field, and say the fix."""
from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from jobs.conversation import DataError, Message
from jobs.spec import BUILTIN_DATASET, DATASET_FORMATS, JobSpec

__all__ = ["DataError", "Message", "load_rows", "detect_format", "to_conversations", "preview_rows"]

ROLE_ALIASES = {"human": "user", "user": "user", "gpt": "assistant", "assistant": "assistant",
                "model": "assistant", "bot": "assistant", "system": "system"}


def load_rows(spec: JobSpec) -> list[dict[str, Any]]:
    if spec.dataset == BUILTIN_DATASET:
        from jobs.builtin.identity import identity_rows
        return identity_rows(spec.bot_name, spec.bot_author)
    path = Path(spec.dataset).expanduser()
    rows = _read_file(path) if path.suffix else _read_hub(spec.dataset)
    if not rows:
        raise DataError(f"{spec.dataset} has no rows: add at least one example")
    for number, row in enumerate(rows, start=1):
        if not isinstance(row, dict):
            raise DataError(f"{path.name} row {number} is {type(row).__name__}, not an object with fields")
    return rows


def _read_file(path: Path) -> list[Any]:
    suffix = path.suffix.lower()
    if suffix == ".jsonl":
        rows = []
        with open(path, encoding="utf-8") as fh:
            for number, line in enumerate(fh, start=1):
                if line.strip():
                    try:
                        rows.append(json.loads(line))
                    except json.JSONDecodeError as exc:
                        raise DataError(f"{path.name} line {number} is not valid JSON: {exc.msg}") from None
        return rows
    if suffix == ".json":
        try:
            data = json.loads(path.read_text(encoding="utf-8"))
        except json.JSONDecodeError as exc:
            raise DataError(f"{path.name} is not valid JSON (line {exc.lineno}): {exc.msg}") from None
        if isinstance(data, dict) and len(data) == 1 and isinstance(next(iter(data.values())), list):
            data = next(iter(data.values()))  # {"train": [...]} style
        if not isinstance(data, list):
            raise DataError(f"{path.name} must hold a list of rows ([{{...}}, {{...}}])")
        return data
    import pandas as pd
    frame = pd.read_csv(path, keep_default_na=False, dtype=str) if suffix == ".csv" else pd.read_parquet(path)
    return [_plain(r) for r in frame.to_dict(orient="records")]


def _plain(value: Any) -> Any:
    """numpy arrays / scalars from parquet into plain lists and values."""
    if hasattr(value, "tolist"):
        value = value.tolist()
    if isinstance(value, dict):
        return {k: _plain(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_plain(v) for v in value]
    return value


def _read_hub(name: str) -> list[dict[str, Any]]:
    try:
        import datasets
        loaded = datasets.load_dataset(name, split="train")
    except Exception as exc:  # datasets raises many unrelated types for "not reachable"
        raise DataError(f"could not load the hub dataset {name!r}: {exc}. Offline? Upload the file "
                        "instead (.json/.jsonl/.csv/.parquet).") from None
    return [dict(r) for r in loaded]


def detect_format(rows: list[dict[str, Any]]) -> str:
    """alpaca, sharegpt, messages or text, from the keys of the first row."""
    keys = set(rows[0])
    if "messages" in keys:
        return "messages"
    if "conversations" in keys:
        return "sharegpt"
    if "instruction" in keys and "output" in keys:
        return "alpaca"
    if "text" in keys:
        return "text"
    raise DataError(
        f"cannot tell the format of row 1 (fields: {', '.join(sorted(keys)) or 'none'}). Expected "
        "alpaca (instruction, input, output), sharegpt (conversations), messages, or text; "
        "or set dataset_format explicitly")


def to_conversations(rows: list[dict[str, Any]], fmt: str) -> list[list[Message] | str]:
    """Each row as messages (chat formats) or as a plain string (text format)."""
    if fmt not in DATASET_FORMATS:
        raise DataError(f"unknown dataset_format {fmt!r}")
    if fmt == "auto":
        fmt = detect_format(rows)
    convert = {"alpaca": _alpaca, "sharegpt": _sharegpt, "messages": _messages, "text": _text}[fmt]
    out = []
    for number, row in enumerate(rows, start=1):
        try:
            out.append(convert(row))
        except DataError as exc:
            raise DataError(f"row {number} ({fmt}): {exc}") from None
    return out


def _field(row: dict[str, Any], key: str, required: bool = True) -> str:
    value = row.get(key)
    if value is None or (isinstance(value, str) and not value.strip()):
        if required:
            raise DataError(f"field '{key}' is missing or empty")
        return ""
    if not isinstance(value, (str, int, float)):
        raise DataError(f"field '{key}' must be text, not {type(value).__name__}")
    return str(value)


def _alpaca(row: dict[str, Any]) -> list[Message]:
    instruction, extra = _field(row, "instruction"), _field(row, "input", required=False)
    prompt = f"{instruction}\n\n{extra}" if extra else instruction
    messages = [{"role": "system", "content": _field(row, "system", False)}] if row.get("system") else []
    return messages + [{"role": "user", "content": prompt}, {"role": "assistant", "content": _field(row, "output")}]


def _sharegpt(row: dict[str, Any]) -> list[Message]:
    turns = row.get("conversations")
    if not isinstance(turns, list) or not turns:
        raise DataError("field 'conversations' must be a non-empty list of {from, value}")
    return _checked([{"role": _role(t.get("from") if isinstance(t, dict) else None, i),
                      "content": _turn_text(t, "value", i)} for i, t in enumerate(turns, 1)])


def _messages(row: dict[str, Any]) -> list[Message]:
    turns = row.get("messages")
    if not isinstance(turns, list) or not turns:
        raise DataError("field 'messages' must be a non-empty list of {role, content}")
    return _checked([{"role": _role(t.get("role") if isinstance(t, dict) else None, i),
                      "content": _turn_text(t, "content", i)} for i, t in enumerate(turns, 1)])


def _text(row: dict[str, Any]) -> str:
    return _field(row, "text")


def _role(value: Any, turn: int) -> str:
    role = ROLE_ALIASES.get(str(value).lower()) if value is not None else None
    if role is None:
        raise DataError(f"turn {turn} has role {value!r}; use one of {', '.join(sorted(ROLE_ALIASES))}")
    return role


def _turn_text(turn: Any, key: str, number: int) -> str:
    if not isinstance(turn, dict) or not isinstance(turn.get(key), str):
        raise DataError(f"turn {number} needs a text field '{key}'")
    return turn[key]


def _checked(messages: list[Message]) -> list[Message]:
    if not any(m["role"] == "assistant" for m in messages):
        raise DataError("has no assistant turn, so there is nothing to train on")
    return messages


def preview_rows(spec: JobSpec, n: int = 3, data_dir=None) -> list[dict]:
    """The first n rows exactly as training will see them: each a dict with `segments`, a list of
    (text, trained) pieces of the chat-templated text, plus `tokens` and `trained_tokens`."""
    from jobs import encode, models
    source = models.resolve_model(spec.model, data_dir, log=lambda _line: None)
    tokenizer = models.load_tokenizer(source)
    encode.ensure_chat_template(tokenizer)
    conversations = to_conversations(load_rows(spec), spec.dataset_format)
    return encode.preview(tokenizer, conversations, spec.max_seq_length, n)
