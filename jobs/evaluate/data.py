"""The rows an evaluation scores, read with the trainer's own readers (jobs/data/): an eval file, or the
job's held-out data (its eval_dataset, or the same seeded eval_fraction split the trainer made:
jobs/train/evaluate.py split_holdout over the rows, in their order).

Three kinds of row, by the first row's keys:
- preference pairs (chosen/rejected, as the preference methods read them): scored by which answer the
  model's log-probabilities prefer;
- chat rows (messages, conversations, alpaca): the turns before the last assistant turn are the prompt,
  that turn is the reference answer;
- prompt rows (prompt, question, ...: GRPO's data): the prompt, the reference from an answer-like column,
  and every other column for the rewards (an `answer`, test cases...)."""
from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field

from jobs.data.dataset import Rows, detect_format, load_rows, to_conversations
from jobs.data.preference import csv_rows, is_preference_row, read_row
from jobs.data.prompts import to_prompt_rows
from jobs.messages import say
from jobs.spec import BUILTIN_PROMPT_DATASETS, JobSpec, SpecError
from jobs.train.evaluate import split_holdout

REFERENCE_COLUMNS = ("answer", "output", "response", "completion", "reference", "solution")
CHAT_FORMATS = ("messages", "sharegpt", "alpaca")


@dataclass
class EvalRow:
    """One prompt to answer: `reference` to score against (None: rewards only), `columns` for the
    rewards; a preference row has `chosen`/`rejected` answers (assistant messages) instead."""

    number: int
    prompt: str | list
    reference: str | None = None
    columns: dict = field(default_factory=dict)
    chosen: list | None = None
    rejected: list | None = None


@dataclass
class EvalData:
    rows: list[EvalRow]
    name: str          # where the rows come from, for messages and the results
    pairs: bool        # preference pairs (log-prob margins) rather than answers to generate


def load_eval_data(eval_file: str, spec: JobSpec, limit: int, data_dir=None, log=print) -> EvalData:
    """The rows to evaluate (the first `limit`; 0: all), or SpecError/DataError saying what is wrong."""
    rows, name = _source_rows(eval_file, spec, data_dir, log)
    if limit:
        rows = Rows(rows[:limit], rows.numbers[:limit], rows.name, rows.wheres[:limit])
    if not rows:
        raise SpecError("eval_file", say("eval_no_rows", name=name))
    if is_preference_row(rows[0]):
        return EvalData(_pair_rows(rows), name, pairs=True)
    keys = set(rows[0]) if isinstance(rows[0], dict) else set()
    chat = keys & {"messages", "conversations"} or {"instruction", "output"} <= keys
    if chat:
        fmt = spec.dataset_format if not eval_file and spec.dataset_format in CHAT_FORMATS else "auto"
        return EvalData(_chat_rows(rows, fmt), name, pairs=False)
    if "text" in keys and not keys & {"prompt", "question", "problem", "query"}:
        raise SpecError("eval_file", say("eval_text_rows", name=name))
    return EvalData(_prompt_rows(rows), name, pairs=False)


def _source_rows(eval_file: str, spec: JobSpec, data_dir, log) -> tuple[Rows, str]:
    if eval_file or spec.eval_dataset:
        source = eval_file or spec.eval_dataset
        rows = load_rows(dataclasses.replace(spec, dataset=source), data_dir, log=log)
        return rows, source
    if spec.eval_fraction <= 0:
        raise SpecError("eval_file", say("eval_no_heldout"))
    if spec.dataset in BUILTIN_PROMPT_DATASETS:
        from jobs.data.builtin.arithmetic import arithmetic_rows
        rows = Rows(arithmetic_rows(seed=spec.seed), name=spec.dataset)
    else:   # general=True: the identity dataset's rows as the trainer read them (the same split)
        rows = load_rows(spec, data_dir, general=True, log=log)
    numbered = list(zip(rows.numbers, rows.wheres, rows))
    _, held = split_holdout(numbered, spec.eval_fraction, spec.seed)
    name = f"{spec.dataset} (held out: eval_fraction {spec.eval_fraction})"
    return Rows([r for _, _, r in held], [n for n, _, _ in held], name, [w for _, w, _ in held]), name


def _pair_rows(rows: Rows) -> list[EvalRow]:
    text_labels = csv_rows(rows)
    out = []
    for number, row in zip(rows.numbers, rows):
        pair = read_row(row, text_labels=text_labels)
        if pair.rejected is not None:   # a KTO row (one answer and a label) has no pair to compare
            out.append(EvalRow(number, pair.prompt, chosen=pair.chosen, rejected=pair.rejected))
    if not out:
        raise SpecError("eval_file", say("eval_no_rows", name=rows.name))
    return out


def _chat_rows(rows: Rows, fmt: str) -> list[EvalRow]:
    if fmt == "auto" and detect_format(rows) not in CHAT_FORMATS:
        raise SpecError("eval_file", say("eval_text_rows", name=rows.name))
    out = []
    for number, messages in zip(rows.numbers, to_conversations(rows, fmt)):
        last = max((i for i, m in enumerate(messages) if m["role"] == "assistant"), default=None)
        if last is None or last == 0:
            out.append(EvalRow(number, messages))
        else:
            out.append(EvalRow(number, messages[:last], messages[last]["content"]))
    return out


def _prompt_rows(rows: Rows) -> list[EvalRow]:
    out = []
    for number, prompt_row in zip(rows.numbers, to_prompt_rows(rows)):
        columns = prompt_row.columns
        reference = next((columns[k] for k in REFERENCE_COLUMNS if isinstance(columns.get(k), (str, int, float))),
                         None)
        out.append(EvalRow(number, prompt_row.prompt, None if reference is None else str(reference), columns))
    return out
