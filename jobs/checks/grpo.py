"""Preflight for method grpo: the prompt data reads (every row has a prompt), and every reward
named in `rewards` exists, built in or as a top-level function of reward_file. The reward file is
read with `ast`, never imported: the studio process does not run a user's code, only the job does."""
from __future__ import annotations

import ast
from pathlib import Path

from jobs.checks.reward_code import reward_code_problem
from jobs.messages import say
from jobs.data.conversation import DataError
from jobs.spec import BUILTIN_REWARDS, JobSpec, reward_entries


def reward_file_functions(path: str) -> list[str]:
    """The names of the file's public top-level functions (the rewards it defines)."""
    tree = ast.parse(Path(path).read_text(encoding="utf-8"), filename=path)
    return [node.name for node in tree.body
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) and not node.name.startswith("_")]


def prompt_tokens(tokenizer, rows: list, max_length: int, sample: int = 2000) -> dict[str, float]:
    """min, mean, p95, max tokens of the prompts as the trainer encodes them (cut to max_length), over
    a seeded sample of at most `sample` rows."""
    import random
    import statistics
    from jobs.data.prompts import encode_prompts
    picked = rows if len(rows) <= sample else random.Random(0).sample(rows, sample)
    ordered = sorted(len(row.input_ids) for row in encode_prompts(tokenizer, picked, max_length))
    return {"min": ordered[0], "mean": round(statistics.fmean(ordered), 1),
            "p95": ordered[min(len(ordered) - 1, int(0.95 * len(ordered)))], "max": ordered[-1]}


def check_grpo(spec: JobSpec, data_dir, report, summary_cls, tokenizer=None) -> None:
    """Adds findings (naming the field) and the prompt data's summary to `report` (with the prompts'
    token lengths when the tokenizer is at hand: the CPU RAM estimate sizes the rollouts by them)."""
    from jobs.data.prompts import load_prompt_rows
    try:
        rows = load_prompt_rows(spec, data_dir, log=lambda _line: None)
    except DataError as exc:
        report.fail("dataset", str(exc))
        rows = None
    if rows is not None:
        columns = sorted({k for row in rows for k in row.columns})
        summary = summary_cls("dataset", spec.dataset, len(rows), "prompts")
        if tokenizer is not None and rows:
            summary.tokens = prompt_tokens(tokenizer, rows, spec.max_seq_length)
        report.datasets.append(summary)
        report.notes.append(f"grpo: {len(rows)} prompts; the rewards get the columns "
                            f"{', '.join(columns) if columns else '(none)'}")
    known = set(BUILTIN_REWARDS)
    problem = spec.reward_file and data_dir and reward_code_problem(spec.reward_file, data_dir)
    if problem:   # the rule for code, as the trainer will apply it (--dry-run says so too)
        report.fail("reward_file", problem)
        return
    if spec.reward_file:
        try:
            functions = reward_file_functions(spec.reward_file)
        except (OSError, SyntaxError, UnicodeDecodeError) as exc:
            report.fail("reward_file", say("reward_file_unreadable", name=Path(spec.reward_file).name, detail=exc))
            return
        if not functions:
            report.fail("reward_file", say("reward_file_empty", name=Path(spec.reward_file).name))
        known |= set(functions)
    for entry in reward_entries(spec.rewards):
        name = entry.partition(":")[0]
        if name not in known:
            report.fail("rewards", say("reward_unknown", name=name, known=", ".join(sorted(known))))
