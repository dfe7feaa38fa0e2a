"""Training data: load a file / hub dataset / the built-in one, detect its format, and turn every
row into a list of chat messages. Errors name the file, the row and the field, and say the fix."""
from __future__ import annotations

import bisect
import json
from pathlib import Path
from typing import Any

from jobs.messages import say
from jobs.data.conversation import DataError, Message
from jobs.data.readers import Problem, iter_rows, max_row_bytes, too_large
from jobs.spec import BUILTIN_CONCISE, BUILTIN_DATASET, DATASET_FORMATS, DATASET_SUFFIXES, JobSpec, hub_id_problem, is_local_reference

__all__ = ["DataError", "Message", "Rows", "load_rows", "scan_rows", "detect_format", "to_conversations",
           "load_conversations", "preview_rows"]

ROLE_ALIASES = {"human": "user", "user": "user", "gpt": "assistant", "assistant": "assistant",
                "model": "assistant", "bot": "assistant", "system": "system"}


MAX_SHOWN = 10  # bad rows listed in a message; the total is always given


class Rows(list):
    """A dataset's rows, with each one's number and place in its file ("row 3 (line 5)") and the
    file's name, so that later checks name the row as the user finds it in the file."""

    def __init__(self, rows=(), numbers=None, name: str = "the dataset", wheres=None):
        super().__init__(rows)
        self.numbers = list(numbers) if numbers is not None else list(range(1, len(self) + 1))
        self.wheres = list(wheres) if wheres is not None else [f"row {n}" for n in self.numbers]
        self.name = name

    def head(self, n: int) -> "Rows":
        return Rows(self[:n], self.numbers[:n], self.name, self.wheres[:n])

    def with_rows(self, rows: list) -> "Rows":
        """Other rows (one for one) in the same places."""
        return Rows(rows, self.numbers, self.name, self.wheres)


class Problems:
    """Bad rows as they are found: how many, and the messages of the first MAX_SHOWN by number."""

    def __init__(self) -> None:
        self._first: list[tuple[int, str]] = []
        self.count = 0

    def add(self, message: str, number: int = 0) -> None:
        self.count += 1
        bisect.insort(self._first, (number, message))
        del self._first[MAX_SHOWN:]

    @property
    def shown(self) -> list[str]:
        return [message for _number, message in self._first]

    def error(self, name: str) -> DataError | None:
        if not self.count:
            return None
        listed = "; ".join(self.shown)  # studio/server_text.py splits this join again to translate
        if self.count == 1:
            return DataError(say("bad_row", name=name, problems=listed))
        if self.count > len(self._first):
            return DataError(say("bad_rows_first", name=name, count=self.count, shown=len(self._first),
                                 problems=listed))
        return DataError(say("bad_rows", name=name, count=self.count, problems=listed))


def source_name(reference: str) -> str:
    return Path(reference).name if is_local_reference(reference, DATASET_SUFFIXES) else reference


def scan_rows(reference: str, limit: int | None = None, first: int | None = None) -> tuple[Rows, Problems]:
    """Read a dataset file or hub dataset (all of it, or its `first` rows and problems), keeping
    its good rows and collecting what is wrong with the others. Memory: one row at a time beyond
    what is kept, each bounded by the row size limit (jobs/data/readers.py)."""
    rows = Rows(name=source_name(reference))
    problems = Problems()
    for item in _source_items(reference, limit):
        if isinstance(item, Problem):
            problems.add(item.message, item.number)
            continue
        number, value, where = item
        if isinstance(value, dict):
            rows.append(value)
            rows.numbers.append(number)
            rows.wheres.append(where)
        else:
            problems.add(say("row_not_object", where=where, kind=_kind(value)), number)
        if first is not None and len(rows) + problems.count >= first:
            break
    return rows, problems


def object_rows(path, problems: "Problems", counts: dict):
    """(number, value, where) of each row of `path` that is a JSON object, in file order; any other
    row's problem goes to `problems`. counts["rows"] counts every row read, bad ones too."""
    for item in iter_rows(path):
        counts["rows"] += 1
        if isinstance(item, Problem):
            problems.add(item.message, item.number)
            continue
        number, value, where = item
        if not isinstance(value, dict):
            problems.add(say("row_not_object", where=where, kind=_kind(value)), number)
            continue
        yield number, value, where


def _kind(value: Any) -> str:
    kinds = {list: "kind_list", str: "kind_string", type(None): "kind_null", bool: "kind_bool"}
    if type(value) in kinds:
        return say(kinds[type(value)])
    return say("kind_number") if isinstance(value, (int, float)) else type(value).__name__


def _source_items(reference: str, limit: int | None):
    if is_local_reference(reference, DATASET_SUFFIXES):
        path = Path(reference).expanduser()
        if not path.is_file():
            raise DataError(say("no_such_data_file", reference=reference))
        return iter_rows(path, limit)
    return _hub_items(reference, max_row_bytes(limit))


def load_rows(spec: JobSpec, data_dir=None, *, general: bool = False, key: str = "dataset",
              limit: int | None = None, log=print) -> Rows:
    """Every row of spec.dataset (or spec.eval_dataset with key="eval_dataset"), or a DataError
    naming the bad rows (the first 10, and how many). The built-in identity dataset includes the
    base model's general answers only with general=True (they may need generating: slow once)."""
    rows, problems = _read(spec, key, data_dir, general, limit, log)
    _raise_for(rows, problems)
    return rows


def _read(spec: JobSpec, key: str, data_dir, general: bool, limit: int | None, log) -> tuple[Rows, Problems]:
    reference = getattr(spec, key)
    if reference == BUILTIN_DATASET:
        return Rows(_identity_rows(spec, data_dir, general, log), name="the identity dataset"), Problems()
    if reference == BUILTIN_CONCISE:
        return Rows(_concise_rows(spec, data_dir, general, log), name=BUILTIN_CONCISE), Problems()
    return scan_rows(reference, limit)


def _raise_for(rows: Rows, problems: Problems) -> None:
    error = problems.error(rows.name)
    if error:
        raise error
    if not rows:
        raise DataError(say("no_rows", name=rows.name))


def _identity_rows(spec: JobSpec, data_dir, general: bool, log) -> list[dict[str, Any]]:
    from jobs.data.builtin import identity
    if not general:
        return identity.identity_rows(spec.bot_name, spec.bot_author)
    from jobs.models import load as models
    from jobs.io import paths
    from jobs.data.builtin.general import base_answers
    source = models.resolve_model(spec.model, data_dir, log=log)
    answers = base_answers(paths.model_cache_dir(paths.data_dir(data_dir)), source, log=log,
                           load_in_4bit=spec.load_in_4bit)
    return identity.identity_dataset(spec.bot_name, spec.bot_author, answers)


def _concise_rows(spec: JobSpec, data_dir, generate: bool, log) -> list[dict[str, Any]]:
    """The built-in preference pairs of spec.model: made from its cached answers, or (generate)
    from answers generated now, once per model. Without them and without generate: a DataError
    that says when they will exist."""
    from jobs.data.builtin.concise import concise_dataset
    from jobs.io import paths
    from jobs.models import load as models
    source = models.resolve_model(spec.model, data_dir, log=log)
    rows = concise_dataset(paths.model_cache_dir(paths.data_dir(data_dir)), source, log=log,
                           load_in_4bit=spec.load_in_4bit, generate=generate)
    if rows is None:
        raise DataError(say("concise_not_generated", concise=BUILTIN_CONCISE))
    return rows


def _hub_items(name: str, limit: int):
    """Rows of a hub dataset, streamed. The id is checked first: owner/name, never a local path
    (datasets.load_dataset would read a local folder of that name)."""
    problem = hub_id_problem(name)
    if problem:
        raise DataError(problem)
    try:
        import datasets
        loaded = datasets.load_dataset(name, split="train", streaming=True)
        for number, row in enumerate(loaded, start=1):
            size = len(json.dumps(row, default=str, ensure_ascii=False).encode())
            where = say("at_row", number=number)
            yield (number, dict(row), where) if size <= limit else Problem(number, too_large(where, size, limit))
    except Exception as exc:  # datasets raises many unrelated types for "not reachable"
        raise DataError(say("hub_dataset_unreachable", name=name, detail=exc)) from None


def detect_format(rows: list[dict[str, Any]]) -> str:
    """alpaca, sharegpt, messages or text, from the keys of the first row."""
    keys = set(rows[0])
    if {"chosen", "rejected"} <= keys or {"prompt", "completion", "label"} <= keys:   # jobs/data/preference.py
        raise DataError(say("sft_got_preference_rows"))
    if "messages" in keys:
        return "messages"
    if "conversations" in keys:
        return "sharegpt"
    if "instruction" in keys and "output" in keys:
        return "alpaca"
    if "text" in keys:
        return "text"
    raise DataError(say("format_unknown", fields=", ".join(sorted(keys)) or "none"))


def to_conversations(rows: list[dict[str, Any]], fmt: str, problems: Problems | None = None
                     ) -> list[list[Message] | str]:
    """Each row as messages (chat formats) or as a plain string (text format). Every bad row is
    found: without `problems` a DataError names the first 10 by number (and how many there are);
    with it, they are added there and the good rows are returned."""
    if fmt not in DATASET_FORMATS:
        raise DataError(say("unknown_dataset_format", fmt=fmt))
    if fmt == "auto":
        fmt = detect_format(rows)
    convert = {"alpaca": _alpaca, "sharegpt": _sharegpt, "messages": _messages, "text": _text}[fmt]
    if not isinstance(rows, Rows):
        rows = Rows(rows)
    out, found = [], problems if problems is not None else Problems()
    for number, where, row in zip(rows.numbers, rows.wheres, rows):
        try:
            out.append(convert(row))
        except DataError as exc:
            label = f"{where[:-1]}, {fmt})" if where.endswith(")") else f"{where} ({fmt})"  # row 3 (line 5, alpaca)
            found.add(say("row_problem", where=label, problem=exc), number)
    error = found.error(getattr(rows, "name", "the dataset"))
    if error and problems is None:
        raise error
    return out


def _field(row: dict[str, Any], key: str, required: bool = True) -> str:
    value = row.get(key)
    if value is None or (isinstance(value, str) and not value.strip()):
        if required:
            raise DataError(say("field_missing", key=key))
        return ""
    if not isinstance(value, (str, int, float)):
        raise DataError(say("field_not_text", key=key, kind=type(value).__name__))
    return str(value)


def _alpaca(row: dict[str, Any]) -> list[Message]:
    instruction, extra = _field(row, "instruction"), _field(row, "input", required=False)
    prompt = f"{instruction}\n\n{extra}" if extra else instruction
    messages = [{"role": "system", "content": _field(row, "system", False)}] if row.get("system") else []
    return messages + [{"role": "user", "content": prompt}, {"role": "assistant", "content": _field(row, "output")}]


def _sharegpt(row: dict[str, Any]) -> list[Message]:
    turns = row.get("conversations")
    if not isinstance(turns, list) or not turns:
        raise DataError(say("conversations_not_list"))
    return _checked([{"role": _role(t.get("from") if isinstance(t, dict) else None, i),
                      "content": _turn_text(t, "value", i)} for i, t in enumerate(turns, 1)])


def _messages(row: dict[str, Any]) -> list[Message]:
    turns = row.get("messages")
    if not isinstance(turns, list) or not turns:
        raise DataError(say("messages_not_list"))
    return _checked([{"role": _role(t.get("role") if isinstance(t, dict) else None, i),
                      "content": _turn_text(t, "content", i)} for i, t in enumerate(turns, 1)])


def _text(row: dict[str, Any]) -> str:
    return _field(row, "text")


def _role(value: Any, turn: int) -> str:
    role = ROLE_ALIASES.get(str(value).lower()) if value is not None else None
    if role is None:
        raise DataError(say("turn_bad_role", turn=turn, role=value, choices=", ".join(sorted(ROLE_ALIASES))))
    return role


def _turn_text(turn: Any, key: str, number: int) -> str:
    if not isinstance(turn, dict) or not isinstance(turn.get(key), str):
        raise DataError(say("turn_needs_text", turn=number, key=key))
    return turn[key]


def _checked(messages: list[Message]) -> list[Message]:
    if not any(m["role"] == "assistant" for m in messages):
        raise DataError(say("no_assistant_turn"))
    if not any(m["content"].strip() for m in messages):
        raise DataError(say("only_empty_messages"))
    if not any(m["content"].strip() for m in messages if m["role"] == "assistant"):
        raise DataError(say("only_empty_answers"))
    return messages


def load_conversations(spec: JobSpec, tokenizer, data_dir=None, key: str = "dataset", log=print
                       ) -> list[list[Message] | str]:
    """What the trainer trains on: every row of spec.dataset (or eval_dataset) as a conversation,
    or one DataError naming every kind of bad row at once (unreadable and wrong fields alike). For
    the built-in identity dataset, also makes the tokenizer's chat template default to the
    identity's system line (the tokenizer is saved with the adapter, so Chat with the tuned model
    uses it too)."""
    rows, problems = _read(spec, key, data_dir, True, None, log)
    if getattr(spec, key) == BUILTIN_DATASET:
        rows = identity_for_template(spec, rows, tokenizer, log)
    conversations = to_conversations(rows, spec.dataset_format, problems) if rows else []
    _raise_for(rows, problems)
    return conversations


def identity_for_template(spec: JobSpec, rows: Rows, tokenizer, log=print) -> Rows:
    """The identity rows as this tokenizer can take them: with their system line, made the chat
    template's default (so Chat with the tuned model starts from it), and again under the base's
    own template (so the name is in the weights, not only in our tokenizer); or, for a template that
    refuses system messages (Mistral's raises), without one."""
    from jobs.data import encode
    from jobs.data.builtin.identity import BASE_TEMPLATE_SYSTEM, system_line, under_each_template
    if not encode.accepts_system(tokenizer):
        log("note: this model's chat template takes no system message; the identity rows go without one")
        return rows.with_rows([{k: v for k, v in row.items() if k != "system"} for row in rows])
    line = system_line(spec.bot_name, spec.bot_author)
    if encode.set_default_system(tokenizer, line, base_marker=BASE_TEMPLATE_SYSTEM):
        log(f"chat template: conversations without a system message now start with {line!r}")
        return Rows(under_each_template(list(rows)), name=rows.name)  # more rows: numbered anew
    return rows


def preview_rows(spec: JobSpec, n: int = 3, data_dir=None, access=None) -> list[dict]:
    """The first n rows exactly as training will see them: each a dict with `segments`, a list of
    (text, trained) pieces of the chat-templated text, plus `tokens` and `trained_tokens`.

    Reads only those rows (a huge file or a huge row later in it costs nothing). With `access` (a
    jobs.checks.access.DataAccess: the studio's), the dataset and model must be ones the studio may read."""
    from jobs.data import encode
    from jobs.models import load as models
    if access is not None:
        spec = access.check_spec(JobSpec.from_dict(spec.to_dict()))
    source = models.resolve_model(spec.model, data_dir, log=lambda _line: None)
    tokenizer = models.load_tokenizer(source)
    encode.ensure_chat_template(tokenizer)
    if spec.dataset == BUILTIN_DATASET:
        rows = identity_for_template(spec, load_rows(spec, data_dir), tokenizer, log=lambda _line: None)
    else:
        rows, problems = scan_rows(spec.dataset, first=n)
        error = problems.error(rows.name)
        if error:
            raise error
        if not rows:
            raise DataError(say("no_rows", name=rows.name))
    first = rows.head(n)
    return encode.preview(tokenizer, to_conversations(first, spec.dataset_format), spec.max_seq_length, n)


def identity_row_counts(spec: JobSpec, data_dir=None) -> tuple[int, int | None, int]:
    """(identity rows as this model trains them, general answers, general prompts) of the built-in dataset: the
    preview shows three rows, and a newcomer should see what the job really trains on. The general
    answers are None while they are not generated yet (the first job on the model makes them)."""
    from jobs.data import encode
    from jobs.data.builtin.general import cached_answers, prompts
    from jobs.io import paths
    from jobs.models import load as models
    source = models.resolve_model(spec.model, data_dir, log=lambda _line: None)
    tokenizer = models.load_tokenizer(source)
    encode.ensure_chat_template(tokenizer)
    rows = identity_for_template(spec, load_rows(spec, data_dir), tokenizer, log=lambda _line: None)
    general = cached_answers(paths.model_cache_dir(paths.data_dir(data_dir)), source)
    return len(rows), None if general is None else len(general), len(prompts())
